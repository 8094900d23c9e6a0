"""Peak resident memory of the recipe's two training steps on a new user's kind of
data: a few hundred short texts (MR's) and a handful over 1,000 words, which the
recipe cuts at 512 pieces.

Each step is fairseq-train as the recipe runs it (finetune.command, nested_command:
the dense ``roberta``, and the nested BudgetFormer with its sandwich of heads and FFN
widths), for one epoch, so that every long text is trained on; its peak resident set
is the kernel's (``ru_maxrss`` of the child, from ``os.wait4``). Both steps run as the
recipe runs them (its ``--max-tokens`` and its malloc setting, finetune.TRAIN_ENV), with
glibc's default malloc, and with ``--batch-size`` alone."""

import argparse
import os
import random
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Dict, List

from budget_plugin.data.prepare import prepare_task
from budget_plugin.nested import finetune
from budget_plugin.nested.recipe import NestedRecipe, nested_command
from budget_plugin.tools.errors import DataError
from budget_plugin.tools.fairseq_cli import console_script

GIB = 1024 ** 3


def add_inputs(parser: argparse.ArgumentParser, repo: Path) -> None:
    """What both memory benchmarks read and where they write."""
    parser.add_argument("--model-dir", type=Path, default=repo / "data" / "minilm" / "model")
    parser.add_argument("--mr-train", type=Path, default=repo / "data" / "minilm" / "raw" / "MR" / "train.tsv")
    parser.add_argument("--out-dir", type=Path, default=repo / "results" / "width")
    parser.add_argument("--threads", type=int, default=2)


def check_inputs(args: argparse.Namespace) -> None:
    for path in (args.model_dir / "model.pt", args.mr_train):
        if not path.is_file():
            raise DataError(f"{path}: not found (python examples/budgetformer/get_data.py fetches it)")


def long_and_short(mr_train: Path, out: Path, short: int, long: int, words: int, seed: int) -> Path:
    """A task folder (train.tsv; dev.tsv and test.tsv, unused) of ``short`` MR sentences and ``long`` texts of
    about ``words`` words each (MR sentences joined), shuffled."""
    rows = [line.split("\t") for line in mr_train.read_text().splitlines()[1:]]
    rng = random.Random(seed)
    rng.shuffle(rows)
    texts = [(text, label) for text, label in rows[:short]]
    pool = iter(rows[short:])
    for _ in range(long):
        joined, label = [], rng.choice("01")
        while sum(len(t.split()) for t in joined) < words:
            joined.append(next(pool)[0])
        texts.append((" ".join(joined), label))
    rng.shuffle(texts)
    out.mkdir(parents=True, exist_ok=True)
    for split, part in (("train", texts), ("dev", texts[:64]), ("test", texts[:64])):
        (out / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{t}\t{y}\n" for t, y in part))
    return out


def peak_rss(command: List, log: Path, threads: int, env: Dict[str, str]) -> Dict[str, float]:
    """Run a fairseq command line to its end (``env`` added to its environment); its
    peak resident memory (GiB) and CPU time."""
    program = console_script(str(command[0]))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1", **env)
    with open(log, "w") as out:
        proc = subprocess.Popen([*program, *map(str, command[1:])], stdout=out, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{command[0]} failed; see {log}:\n{log.read_text()[-2000:]}")
    return {"peak_rss_gib": usage.ru_maxrss * 1024 / GIB, "cpu_s": usage.ru_utime + usage.ru_stime}


def measure(model_dir: Path, mr_train: Path, work: Path, short: int = 256, long: int = 6, words: int = 1200,
            seed: int = 1, threads: int = 2, log=print, keep=lambda rows: None) -> List[dict]:
    """Peak memory of the dense and the nested step, with the recipe's --max-tokens and
    without (--batch-size alone), on the same data, one epoch each; ``keep(rows)`` after
    every step, so that a run stopped midway keeps what it measured."""
    task = long_and_short(mr_train, work / "raw" / "LONG", short, long, words, seed)
    summary = prepare_task(task, work, layout="SST-2", name="LONG", labelled_test=True, wordpiece=model_dir,
                           log=lambda _: None)
    data = Path(summary.out_dir)
    examples = short + long
    rows = []
    recipe_env = finetune.TRAIN_ENV
    settings = [(finetune.Recipe().max_tokens, recipe_env), (finetune.Recipe().max_tokens, {}), (None, recipe_env)]
    for max_tokens, env in settings:
        recipe = replace(finetune.Recipe(seed=seed, epochs=1, save_optimizer=False), max_tokens=max_tokens)
        updates = 10_000  # one epoch: the batches --max-tokens makes are more than examples / batch_size
        steps = {
            "dense": finetune.command("dense", data, model_dir, work / "dense", recipe, examples),
            "nested": nested_command(data, model_dir / "model.pt", model_dir / "model.pt", work / "nested", recipe,
                                     NestedRecipe(), updates, classes=2),
        }
        malloc = "the recipe's" if env else "glibc's default"
        for name, command in steps.items():
            command = [*command, "--no-save", "--disable-validation", "--max-epoch", 1]
            log(f"{name} step, max_tokens {max_tokens}, {malloc} malloc settings: running one epoch")
            found = peak_rss(command, work / f"{name}-{max_tokens}-{bool(env)}.log", threads, env)
            rows.append({"step": name, "max_tokens": max_tokens, "malloc": malloc, "env": env, **found})
            log(f"  peak resident memory {found['peak_rss_gib']:.2f} GiB")
            keep(rows)
    return rows
