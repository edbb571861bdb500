"""What a schedule costs once placed: devices chosen and ordered (``placement``), memory per
device (``ledger``), the priced step (``timing``), device renamings at wave boundaries
and spread loss phases (``relabel``), and the plan built from it
(``build``)."""
