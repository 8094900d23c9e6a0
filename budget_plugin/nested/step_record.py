"""SAVE_DIR/recipe.json: what each finished step of the recipe was run with, so that the
same command again resumes where it stopped, and a changed step is refused (or, with
``redo``, run again with every step after it)."""

import json
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

from budget_plugin.tools.errors import DataError
from budget_plugin.tools.files import write_json

# fairseq-train options that change nothing a step makes, left out of its record
UNRECORDED = ("--log-interval",)


class Step(NamedTuple):
    name: str
    heading: str  # what the progress line says it does
    record: object  # what decides its output: fairseq's command line, or its settings
    run: Callable[[], None]


def recorded(command: list) -> list:
    """A fairseq command line as a step's record: strings, without UNRECORDED options."""
    tokens = [str(c) for c in command]
    return [token for i, token in enumerate(tokens) if token not in UNRECORDED and
            (i == 0 or tokens[i - 1] not in UNRECORDED)]


def options_of(spec) -> Dict[str, str]:
    """A step's record as option -> value: a command line's ``--flag value`` pairs (what
    precedes the first flag under ``arguments``), or a dict of settings as it is."""
    if isinstance(spec, dict):
        return {key: json.dumps(value) for key, value in spec.items()}
    found, key = {}, "arguments"
    for token in map(str, spec):
        if token.startswith("--"):
            key = token
            found[key] = ""
        else:
            found[key] = f"{found.get(key, '')} {token}".strip()
    return found


def difference(recorded, planned) -> str:
    """What differs between a step's recorded and planned runs, option by option."""
    old, new = options_of(recorded), options_of(planned)

    def shown(value: Optional[str]) -> str:
        return "(unset)" if value is None else value or "(set)"  # a flag without a value is set

    return "; ".join(f"{key} {shown(old.get(key))} (now {shown(new.get(key))})"
                     for key in sorted(old.keys() | new.keys()) if old.get(key) != new.get(key))


class StepRecord:
    """SAVE_DIR/recipe.json: what each finished step was run with, in step order."""

    def __init__(self, save_dir: Path):
        self.path = save_dir / "recipe.json"
        self.steps = json.loads(self.path.read_text()) if self.path.is_file() else {}

    def done(self, name: str) -> bool:
        return name in self.steps

    def finish(self, name: str, spec) -> None:
        self.steps[name] = spec
        write_json(self.path, self.steps)

    def check(self, planned: Dict[str, object], save_dir: Path, redo: bool, log: Callable[[str], None]) -> None:
        """Refuse the first recorded step whose run differs from the planned one; with
        ``redo``, forget it and every step after it, so that they run again (over their
        old files: each step writes all of its output). A step without a record (cut
        short, or from an older version of the recipe) runs again too."""
        names = list(planned)
        stale = next((n for n in names if n in self.steps and self.steps[n] != planned[n]), None)
        if stale is not None and not redo:
            raise DataError(f"{save_dir}: its {stale} step was run with other options: "
                            f"{difference(self.steps[stale], planned[stale])}; give --redo to run it and the steps "
                            "after it again, or another SAVE_DIR")
        if stale is not None:
            log(f"--redo: the {stale} step's options changed; it and the steps after it run again")
        # the first step to run: every step after it takes its output as input
        first = next((i for i, n in enumerate(names) if self.steps.get(n) != planned[n]), len(names))
        for name in names[first:]:
            self.steps.pop(name, None)
        write_json(self.path, self.steps)


def run_steps(steps: List[Step], save_dir: Path, redo: bool, log: Callable[[str], None]) -> None:
    """Each step in order, unless its record says it is done with the same options."""
    record = StepRecord(save_dir)
    record.check({step.name: step.record for step in steps}, save_dir, redo, log)
    for number, step in enumerate(steps, 1):
        heading = f"recipe {number}/{len(steps)}: {step.heading}"
        if record.done(step.name):
            log(f"{heading}: done before, with the same options")
            continue
        log(heading)
        step.run()
        record.finish(step.name, step.record)
