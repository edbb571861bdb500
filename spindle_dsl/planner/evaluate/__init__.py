"""What a schedule costs once placed: devices chosen (``placement``, ``nodepool``,
``shard_order``), memory per device (``ledger``, ``plan_memory``), the priced step
(``timing``), device renamings at wave boundaries and for loss phases (``relabel``,
``cutmatch``, ``lossbalance``, ``lossspread``), and the plan built from it (``build``)."""
