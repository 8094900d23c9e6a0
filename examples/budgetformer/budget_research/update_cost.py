"""What an update of each candidate nested step costs, side by side (issue 42: "the cost
of the router's pass where users serve fixed widths"). Each contender is a recorded
fairseq-train command (the recipe's dense step, its nested step, the nested step with a
candidate's options): its trainer is built as fairseq-train builds it, from the same
start, and every contender trains on the same real training batches, one update each in
turn, the order rotating from round to round. The medians of the timed rounds (the
first is a warm-up) are comparable; a training run's wall time, shared with whatever else
the machine ran, is not."""

import statistics
import warnings
from typing import Dict, List

import torch

from budget_plugin.tools.rotation import rotation
from budget_research.timing import timed


def trainer_from(command: List[str]):
    """fairseq's trainer for a recorded fairseq-train command, its start loaded as
    fairseq-train loads it (--restore-file with the recipe's resets), and its train split."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    with warnings.catch_warnings():  # hydra's deprecation notices
        warnings.simplefilter("ignore")
        args = options.parse_args_and_arch(options.get_training_parser(), [str(a) for a in command[1:]])
        cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train", combine=False, epoch=1)
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    trainer.load_checkpoint(cfg.checkpoint.restore_file, reset_optimizer=True, reset_lr_scheduler=False,
                            optimizer_overrides={}, reset_meters=True)
    return trainer


def first_batches(trainer, count: int) -> List[dict]:
    """The first ``count`` batches of the trainer's first epoch (fairseq's shuffled order)."""
    batches = trainer.get_train_iterator(epoch=1, load_dataset=False).next_epoch_itr(shuffle=True)
    return [next(batches) for _ in range(count)]


def update_costs(commands: Dict[str, List[str]], rounds: int = 6, threads: int = 2) -> List[dict]:
    """Seconds per update of each contender: the median of ``rounds`` timed rounds after
    one warm-up, every contender on round r's batch (the first contender's r-th), and
    each median's ratio to the first contender's."""
    torch.set_num_threads(threads)
    trainers = {name: trainer_from(command) for name, command in commands.items()}
    batches = first_batches(next(iter(trainers.values())), rounds + 1)
    names, seconds = list(trainers), {name: [] for name in trainers}
    cpu = torch.device("cpu")
    for r, batch in enumerate(batches):
        for i in rotation(len(names), r):
            ms, _ = timed(lambda: trainers[names[i]].train_step([batch]), cpu)
            if r:
                seconds[names[i]].append(ms / 1e3)
    medians = {name: statistics.median(seconds[name]) for name in names}
    return [{"name": name, "update_s": medians[name], "vs_first": medians[name] / medians[names[0]],
             "rounds": len(seconds[name]), "updates": trainers[name].get_num_updates(),
             "spread_s": [min(seconds[name]), max(seconds[name])]} for name in names]


def report(rows: List[dict], title: str, options: Dict[str, str]) -> str:
    """The table, and what each contender is (``options``: name -> its options, in words)."""
    first = rows[0]["name"]
    lines = [f"# {title}", "", "Seconds per update, median of the timed rounds (every contender on the same real "
             "batches, in turn, rotating; one warm-up round not counted), on this machine's 2 cores.", "",
             f"| contender | s / update | vs {first} | min-max (s) | rounds |", "|---|---|---|---|---|"]
    for row in rows:
        low, high = row["spread_s"]
        lines.append(f"| {row['name']} | {row['update_s']:.2f} | {row['vs_first']:.2f}x | {low:.2f}-{high:.2f} | "
                     f"{row['rounds']} |")
    lines += ["", "The contenders:", ""] + [f"- {name}: {what}" for name, what in options.items()]
    return "\n".join(lines) + "\n"
