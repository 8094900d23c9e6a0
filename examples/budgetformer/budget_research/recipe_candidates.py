"""Which nested step keeps the narrow widths' accuracy (issue 42, point 1)? Each
candidate is the recipe's own nested step (its fairseq-train command, as SAVE_DIR/recipe.json
recorded it) from the same reordered dense model, with the candidate's options added;
each is scored on dev at every width in both allocations, as the recipe's last step
scores them (hidden_distillation.compare_nested). Every finished candidate's training
(SAVE_DIR/candidates/NAME/) and its scores (the record) are kept: a second run trains and
scores only what is missing. Choices are made on dev; test is not read here."""

import json
import re
from pathlib import Path
from typing import Callable, Dict, List

from budget_plugin.nested.recipe import train_step
from budget_plugin.tools.files import write_json
from budget_plugin.tools.teacher import save_logits, teacher_logits
from budget_research.hidden_distillation import compare_nested
from budget_research.recipe_study import replaced

TEACHER = "{teacher}"  # stands for the dense step's logits on train (budget-teacher-logits' file)
TWICE_THE_UPDATES = "{twice the updates}"  # the recipe's updates doubled, its warm-up the same share of them
MARKERS = {TEACHER: "the dense step's logits on every training example",
           TWICE_THE_UPDATES: "the recipe's `--max-update`, `--total-num-update` and `--warmup-updates` doubled"}

CANDIDATES: Dict[str, List[str]] = {
    # the recipe as it is: every width distils the full width's logits in place
    "recipe": [],
    # every width (and the full one) distils the dense step's model instead (DynaBERT's teacher)
    "dense teacher": ["--distill-logits", TEACHER],
    # the sandwich's random width at most half of each layer: two of its three widths narrow
    "narrow sandwich": ["--sandwich-max-ratio", "0.5"],
    "dense teacher, narrow sandwich": ["--distill-logits", TEACHER, "--sandwich-max-ratio", "0.5"],
    # the sandwich's smallest width at 3 of 12 heads (was 2), with the FFN's smallest (0.25): the
    # narrowest width served (0.25) trained every update, not a narrower one no one serves
    "smallest width 0.25": ["--min-heads", "3"],
    "narrow sandwich, smallest width 0.25": ["--sandwich-max-ratio", "0.5", "--min-heads", "3"],
    # the fixed widths only, for a model served at fixed widths: the router's pass (its per-input
    # budgets, at every FFN neuron) is about a third of an update
    "narrow sandwich, no router pass": ["--sandwich-max-ratio", "0.5", "--no-router-pass"],
    # the router's pass traded for a second random narrow width: the same passes, all of them widths
    "narrow sandwich, a random width for the router's pass": ["--sandwich-max-ratio", "0.5", "--sandwich-widths", "4",
                                                             "--no-router-pass"],
    # twice the recipe's updates (MR's 240 are 0.75 of an epoch: are the narrow widths short of
    # training, or of capacity?). Outside the main job's time bound: it asks what the narrow
    # widths need, not what the recipe can afford
    "narrow sandwich, twice the updates": ["--sandwich-max-ratio", "0.5", TWICE_THE_UPDATES],
    # the router's pass (0.39 of a nested update) on one update in 4, the fixed widths alone
    # on the others (issue 51, point 2): do the budgets and the head dial still learn?
    "router every 4th update": ["--router-interval", "4"],
    "router every 2nd update": ["--router-interval", "2"],
    # the sandwich's passes, priced one by one (update_cost.py): the full width and the smallest
    # only, and the full width alone with the router's pass
    "full and smallest widths only": ["--sandwich-widths", "2", "--no-router-pass"],
    "full width and the router's pass": ["--sandwich-widths", "1", "--min-ffn-ratio", "0"],
}


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def candidate_command(recipe: dict, save_dir: Path, name: str, teacher: Path) -> List[str]:
    """The recipe's nested command with its save dir moved to SAVE_DIR/candidates/NAME
    (and its schedule doubled where the candidate says so) and the candidate's options
    appended (fairseq's parser keeps an option's last value)."""
    out = save_dir.resolve() / "candidates" / slug(name)
    command = replaced(recipe["nested"], {"--save-dir": out, "--tensorboard-logdir": out / "tensorboard"})
    options = CANDIDATES[name]
    if TWICE_THE_UPDATES in options:
        updates, warmup = (2 * int(command[command.index(flag) + 1]) for flag in ("--max-update", "--warmup-updates"))
        command = replaced(command, {"--max-update": updates, "--total-num-update": updates,
                                     "--warmup-updates": warmup})
    return command + [str(teacher) if option == TEACHER else option for option in options
                      if option != TWICE_THE_UPDATES]


def dense_teacher(save_dir: Path, data: Path, log: Callable[[str], None]) -> Path:
    """The dense step's logits on every training example, computed once."""
    path = save_dir / "dense" / "teacher_train.pt"
    if not path.is_file():
        log(f"the dense step's logits on train -> {path}")
        save_logits(path, teacher_logits(save_dir / "dense" / "checkpoint_best.pt", data, "train"))
    return path


def run_candidates(save_dir: Path, data: Path, names: List[str], record: Path, threads: int = 2,
                   log: Callable[[str], None] = print, shared: bool = False) -> dict:
    """Train (unless trained) and score (unless scored) each named candidate; the record
    ({name: {"options", "train_wall_s", "dev"}}, and "shared" where the machine ran other
    work beside the training: ``shared``) is rewritten after each."""
    recipe = json.loads((save_dir / "recipe.json").read_text())
    found = json.loads(record.read_text()) if record.is_file() else {}
    for name in names:
        if name in found:
            continue
        if name == "recipe":
            checkpoint = save_dir / "nested" / "checkpoint_best.pt"
            wall = json.loads((save_dir / "nested" / "done.json").read_text())["train_wall_s"]
        else:
            teacher = dense_teacher(save_dir, data, log) if TEACHER in CANDIDATES[name] else None
            command = candidate_command(recipe, save_dir, name, teacher)
            out = Path(command[command.index("--save-dir") + 1])
            done = out / "done.json"
            wall = (json.loads(done.read_text()) if done.is_file() else
                    train_step(f"candidate {name!r}", command, out, log, threads))["train_wall_s"]
            checkpoint = out / "checkpoint_best.pt"
        dev = compare_nested({name: checkpoint}, data, save_dir, log=log)[name]
        found[name] = {"options": CANDIDATES[name], "train_wall_s": wall, "dev": dev}
        if shared:
            found[name]["shared"] = True
        write_json(record, found)
    return found


def report(found: dict, title: str) -> str:
    names = list(found)
    widths = list(found[names[0]]["dev"]["uniform"])
    lines = [f"# {title}", "", "Dev accuracy at each width (the nested model's own dial, no export), and the "
             "nested step's wall time on 2 cores.", "",
             "| allocation | width | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for allocation in ("uniform", "importance"):
        for width in widths:
            lines.append(f"| {allocation} | {width} | " + " | ".join(
                f"{found[n]['dev'][allocation][width]['accuracy']:.2f}" for n in names) + " |")
        narrow = [w for w in widths if float(w) <= 0.4]
        for label, chosen in (("mean", widths), ("mean of 0.4 and below", narrow)):
            lines.append(f"| {allocation} | {label} | " + " | ".join(
                f"{sum(found[n]['dev'][allocation][w]['accuracy'] for w in chosen) / len(chosen):.2f}"
                for n in names) + " |")
    lines.append("| | training (s) | " + " | ".join(
        f"{found[n]['train_wall_s']}" + (" (shared)" if found[n].get("shared") else "") for n in names) + " |")
    if any(found[n].get("shared") for n in names):
        lines += ["", "(shared): trained while other work ran on the machine, so its wall time is not the step's "
                  "cost; update-cost-*.md times an update of each side by side."]
    lines += ["", "Options each added to the recipe's nested step:", ""]
    lines += [f"- {n}: `{' '.join(found[n]['options']) or '(none)'}`" for n in names]
    used = [f"- `{marker}`: {meaning}" for marker, meaning in MARKERS.items()
            if any(marker in found[n]["options"] for n in names)]
    lines += ["", "Where:", "", *used] if used else []
    return "\n".join(lines) + "\n"
