"""Write the project's notebooks from this one script, without outputs.

Notebooks are JSON that is hard to review and easy to commit with stale outputs; generating them
from readable Python keeps diffs small and guarantees they are stored clean. The tests check
that the stored ``.ipynb`` files equal what this script writes, then execute them.

    python notebooks/build_notebooks.py          # rewrite the notebooks
    python notebooks/build_notebooks.py --check  # exit 1 if a stored notebook is out of date
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

# Every notebook starts by finding the repository root, so it runs from `notebooks/`, from the
# root, or under nbclient/Voila with either as the working directory.
FIND_ROOT = """\
from pathlib import Path

import spindle_dsl

# the checkout this notebook belongs to: the working directory or a parent of it, else the
# checkout the package was installed from (pip install -e .)
ROOT = next(
    (p for p in (Path.cwd(), *Path.cwd().parents) if (p / "examples").is_dir()),
    Path(spindle_dsl.__file__).resolve().parents[1],
)
EXAMPLES = ROOT / "examples\""""


def md(text: str):
    return new_markdown_cell(text.strip())


def code(text: str):
    return new_code_cell(text.strip())


def quickstart():
    return [
        md("""
# Spindle-DSL quickstart

Load a `.spindle` spec, check it, plan it with Spindle's wavefront scheduler, and draw the plan.
Everything here is also a CLI command (`spindle check`, `spindle plan`, `spindle render`).
"""),
        code(FIND_ROOT),
        md(
            "## Load and check a spec\n`compile_file` parses, checks and lowers the spec to a "
            "MetaGraph: MetaOps (layers of one module for one task), their dependencies and "
            "MetaLevels."
        ),
        code("""
from spindle_dsl.language import compile_file

compiled = compile_file(EXAMPLES / "tiny_mm.spindle")
graph = compiled.graph
print(compiled.render_warnings() or "no warnings")
for op in graph.metaops:
    print(f"level {op.level}  {op.id:28} L={op.layers:<3} batch={op.batch:<4} tokens={op.tokens}")
assert graph.mix == "default" and sum(t.batch for t in graph.tasks) == 32
"""),
        md("In Jupyter a MetaGraph draws itself: a cluster per task, shared modules as cylinders."),
        code("graph"),
        md(
            "## Errors point at the line\nA broken spec raises `SpecError` with every error "
            "found, each with its line, column and a caret."
        ),
        code("""
from spindle_dsl.errors import SpecError
from spindle_dsl.language import compile_text

broken = (EXAMPLES / "tiny_mm.spindle").read_text().replace("-> vision ->", "-> visoin ->", 1)
try:
    compile_text(broken, "tiny_mm_typo.spindle")
except SpecError as err:
    print(err.render())
    assert "visoin" in err.render()
else:
    raise AssertionError("the typo should have been reported")
"""),
        md(
            "## Plan\nThe analytic cost model gives each MetaOp's time curve T_m(n); the "
            "planner allocates devices per MetaLevel and cuts the work into waves."
        ),
        code("""
from spindle_dsl.cost import make_cost_model
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.planner import make_plan

cost = make_cost_model(graph.cluster)
plan = make_plan(graph, cost)
assert validate_plan(plan) == [], validate_plan(plan)
print(f"iteration {plan.iteration_s * 1e3:.2f} ms, lower bound {plan.lower_bound_s * 1e3:.2f} ms")
for name, secs in plan.baselines:
    print(f"  {name:24} {secs * 1e3:8.2f} ms  speed-up {secs / plan.iteration_s:.2f}x")
"""),
        code("plan"),
        md(
            "## Render\nThe wave picture (Graphviz), the timeline (matplotlib) and a Chrome "
            "trace that opens in Perfetto."
        ),
        code("""
from IPython.display import SVG, display

from spindle_dsl.render.dot_waves import waves_dot
from spindle_dsl.render.graphviz_tools import dot_available, render_dot
from spindle_dsl.render.timeline import timeline_bytes

if dot_available():
    display(SVG(render_dot(waves_dot(plan), "svg")))
else:
    print("install Graphviz (`dot`) to draw the waves")
display(SVG(timeline_bytes(plan, "svg")))
"""),
        md(
            "## Save the plan\n`plan.json` is the public plan format; `spindle train --plan` "
            "runs it."
        ),
        code("""
import tempfile

from spindle_dsl.plan import Plan
from spindle_dsl.render.trace import plan_trace, write_trace

out = Path(tempfile.mkdtemp(prefix="spindle-quickstart-"))
plan.write(out / "plan.json")
write_trace(out / "trace.json", plan_trace(plan))
assert Plan.read(out / "plan.json") == plan
print(sorted(p.name for p in out.iterdir()))
"""),
    ]


def interactive_planning():
    return [
        md("""
# Interactive planning

Move the sliders and the plan redraws: devices, device type, scheduler, the data mix and each
task's weight. Each move shows a quick plan at once; the planner's full search follows in the
background and replaces it where quicker (the status line under the outputs says which).
Edit the spec below the controls; errors show as you type, and the last good plan stays on
screen until the spec is fixed. **Export** writes the plan JSON, a Chrome trace and an HTML
report.
"""),
        code(FIND_ROOT),
        code("""
from spindle_dsl.widgets import PlannerWidget

planner = PlannerWidget.from_file(EXAMPLES / "multitask_clip.spindle", export_dir="spindle-export")
assert planner.view.ok, planner.view.error  # the spec as written plans
planner
"""),
        md("""
## The same session from code

The widget is a shell over `PlanningSession`, which needs no kernel: sweep a setting and
tabulate the result. Its caches make repeated settings free. Every setting must plan: a view
that is not `ok` holds the last good plan, so the sweep stops there instead of printing a row
for a plan made for other settings.
"""),
        code("""
from spindle_dsl.plan.validate import validate_plan
from spindle_dsl.widgets import PlanningSession, Settings
from spindle_dsl.widgets.pipeline import real_pipeline

spec = EXAMPLES / "multitask_clip.spindle"
session = PlanningSession(real_pipeline(), Settings(spec.read_text(), str(spec)))
iteration = {}
print(f"{'devices':>8} {'iteration':>10} {'vs sequential':>14} {'re-plan':>8}")
for n in (8, 16, 24, 32, 48, 64):
    view = session.update(devices=n)
    assert view.ok, f"no plan for {n} devices:\\n{view.error}"
    plan = view.result.plan
    assert plan.cluster.devices == n and validate_plan(plan) == [], validate_plan(plan)
    # the plan is at or above its lower bound, and no slower than the tasks one after another
    assert plan.lower_bound_s <= plan.iteration_s <= plan.baseline("sequential_s") * (1 + 1e-9)
    iteration[n] = plan.iteration_s
    speedup = plan.baseline("sequential_s") / plan.iteration_s
    print(f"{n:8} {plan.iteration_s:9.3f}s {speedup:13.2f}x {view.timings.total_s:7.3f}s")
# 8x the devices: well over 3x faster (the analytic model gives about 7x)
assert iteration[64] < iteration[8] / 3, iteration
"""),
    ]


def train_tiny_mm():
    return [
        md("""
# Train tiny_mm on CPU

`tiny_mm` is a two-task vision/audio-language model small enough to train for real on a laptop.
`spindle train` plans it, starts one worker process per device (gloo on CPU), runs the plan wave
by wave, and logs every step's loss per task. The same command runs on GPUs under `torchrun`.
"""),
        code(FIND_ROOT),
        code("""
import json
import subprocess
import sys
import tempfile

STEPS = 30
out = Path(tempfile.mkdtemp(prefix="spindle-train-"))
log = out / "steps.jsonl"
spec = EXAMPLES / "tiny_mm.spindle"
args = ["train", str(spec), "--nproc", "2", "--steps", str(STEPS), "--log-json", str(log)]
cmd = [sys.executable, "-m", "spindle_dsl", *args]
print("$ spindle", " ".join(args))
done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
print(done.stdout[-3000:])
print(done.stderr[-3000:])
assert done.returncode == 0, f"spindle train failed with exit code {done.returncode}"
"""),
        md(
            "Each line of the log is one optimizer step: the mean loss of every task's batch "
            "and the step's wall time."
        ),
        code("""
records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
assert [r["step"] for r in records] == list(range(1, STEPS + 1))
tasks = list(records[0]["loss"])
for r in records:
    losses = "  ".join(f"{t} {r['loss'][t]:.4f}" for t in tasks)
    print(f"step {r['step']}  {r['seconds']:.3f} s  {losses}")
"""),
        code("""
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3.5))
for task in tasks:
    ax.plot([r["step"] for r in records], [r["loss"][task] for r in records], "o-", label=task)
ax.set_xlabel("step")
ax.set_ylabel("loss")
ax.set_title("tiny_mm on 2 CPU workers")
ax.legend()
plt.show()
first, last = records[0]["loss"], records[-1]["loss"]
print({t: f"{first[t]:.3f} -> {last[t]:.3f}" for t in tasks})
for task in tasks:  # the model learns: the last steps average below the first ones
    early = sum(r["loss"][task] for r in records[:5]) / 5
    late = sum(r["loss"][task] for r in records[-5:]) / 5
    assert late < early, (task, early, late)
"""),
    ]


def digits():
    return [
        md("""
# Real data: handwritten digits, captioned

scikit-learn ships 1,797 handwritten digits (8x8 grey images) inside its wheel. This notebook
writes them as a Spindle data folder (one memory-mapped `.npy` array per modality), captions
each image with its class name ("a handwritten digit seven ."), trains a vit + SwiGLU/RMSNorm/
rotary language model on 2 CPU worker processes, exports the trained weights as safetensors,
and scores 297 held-out digits the model never saw. The code is `examples/digits.py`
(`python examples/digits.py` runs it as a script).
"""),
        code(FIND_ROOT),
        code("""
import sys
import tempfile

sys.path.insert(0, str(EXAMPLES))
import digits

out = Path(tempfile.mkdtemp(prefix="spindle-digits-"))
print(digits.SPEC)
"""),
        md(
            "Train, export, score. Held-out scores come from the exported file loaded strictly "
            "into the single-process reference model, before and after training."
        ),
        code("""
STEPS = 150
result = digits.run(STEPS, out)
print(f"{STEPS} steps in {result.seconds:.1f} s on 2 worker processes")
print(f"training loss: {result.losses[0]:.3f} at step 1, {result.losses[-1]:.3f} at step {STEPS}")
print(f"held-out class-word accuracy: {result.before.accuracy:.1%} -> {result.after.accuracy:.1%}")
print(f"held-out caption loss: {result.before.loss:.3f} -> {result.after.loss:.3f}")
"""),
        code("""
import matplotlib.pyplot as plt

fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(range(1, STEPS + 1), result.losses)
ax.set_yscale("log")
ax.set_xlabel("step")
ax.set_ylabel("training loss (caption)")
ax.set_title("digits, 2 CPU workers")
plt.show()
# the loss falls well below its start, and held-out digits are read far above chance (10%)
assert sum(result.losses[-10:]) / 10 < 0.25 * result.losses[0]
assert result.after.loss < result.before.loss / 3
assert result.after.accuracy > 0.5 > result.before.accuracy
"""),
        md('A few held-out digits with the word the trained model predicts after "digit":'),
        code("""
import numpy as np
import torch

from spindle_dsl.backends.torch import ReferenceModel
from spindle_dsl.language import compile_file

graph = compile_file(out / "digits.spindle").graph
model = ReferenceModel(graph, datasets={"caption": str(out / "held_out" / "caption")})
model.load_weights(str(out / "digits.safetensors"))
with torch.no_grad():
    words = model.lm_logits("caption", 0, 8)[:, digits.CLASS_POSITION - 1].argmax(-1)
images = np.load(out / "held_out" / "caption" / "image.npy")[:8, 0]
fig, axes = plt.subplots(1, 8, figsize=(10, 1.8))
for ax, image, word in zip(axes, images, words, strict=True):
    ax.imshow(image, cmap="gray_r")
    ax.set_title(digits.VOCAB[int(word)])
    ax.axis("off")
plt.show()
"""),
    ]


def hf_vlm():
    return [
        md("""
# From Hugging Face folders and back: a small LLaVA-style job

transformers builds a SigLIP vision tower and a Qwen2-style language model from configs (tiny
ones, no download) and saves them as folders. The spec reads them with `hf("...")`, joins them
with an `mlp` adapter, and trains the adapter and the language model (the tower frozen) on
captioned handwritten digits on 2 CPU worker processes. `spindle export --format hf` writes the
trained models as folders again, and transformers loads them to score held-out captions. The
code is `examples/hf_vlm.py`.
"""),
        code(FIND_ROOT),
        code("""
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # models come from configs, never the hub
sys.path.insert(0, str(EXAMPLES))
import hf_vlm

out = Path(tempfile.mkdtemp(prefix="spindle-hf-vlm-"))
print(hf_vlm.SPEC)
"""),
        md("Train, export as Hugging Face folders, and score with transformers:"),
        code("""
STEPS = 150
r = hf_vlm.run(STEPS, out)
print(f"training loss: step 1 {r.first_loss:.3f}, step {STEPS} {r.last_loss:.3f}")
print(f"held-out loss (transformers): {r.before.loss:.3f} -> {r.after.loss:.3f}")
print(f"held-out class-word accuracy: {r.before.accuracy:.1%} -> {r.after.accuracy:.1%}")
print(f"the project's own model: loss {r.spindle_after.loss:.3f}")
# trained, and transformers computes what the project computes from the exported folders
assert r.after.loss < r.before.loss / 3
assert abs(r.after.loss - r.spindle_after.loss) < 1e-4 * max(1.0, r.after.loss)
"""),
        md("The exported folders open in transformers like any other checkpoint:"),
        code("""
from transformers import AutoConfig

for folder in ("vision", "lm"):
    config = AutoConfig.from_pretrained(out / "export" / folder)
    print(folder, config.model_type, sorted(p.name for p in (out / "export" / folder).iterdir()))
"""),
    ]


NOTEBOOKS = {
    "quickstart.ipynb": quickstart,
    "interactive_planning.ipynb": interactive_planning,
    "train_tiny_mm.ipynb": train_tiny_mm,
    "digits.ipynb": digits,
    "hf_vlm.ipynb": hf_vlm,
}


def build(name: str):
    nb = new_notebook(cells=NOTEBOOKS[name]())
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.metadata["language_info"] = {"name": "python"}
    # nbformat gives every cell a random id; fixed ids keep the stored files reproducible.
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{Path(name).stem[:20]}-{i}"
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(name)) + "\n"


def main(argv: list[str]) -> int:
    stale = []
    for name in NOTEBOOKS:
        path = HERE / name
        text = render(name)
        if "--check" in argv:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print("out of date (run python notebooks/build_notebooks.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
