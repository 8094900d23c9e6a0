"""The benchmark report's markdown: a row per inference cell and implementation, the
training tables, and the profiles."""

from typing import List


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def markdown_table(cells: List[dict]) -> str:
    header = (
        "| size | batch | len | impl | heads | attn ms | fwd ms | attn GFLOP | total GFLOP "
        "| peak MB fwd | peak MB attn | ideal x | measured x | eff | attn ideal x "
        "| attn measured x | attn eff | attn cpu ms | fwd cpu ms | attn cpu x | fwd cpu eff | tok/s |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for c in cells:
        lines.append(
            f"| {c['size']} | {c['batch']} | {c['seq_len']} | {_label(c)} | {c['heads_run']:.2f} "
            f"| {c['attn_ms']:.2f} | {c['forward_ms']:.2f} | {c['attn_flops'] / 1e9:.3f} "
            f"| {c['total_flops'] / 1e9:.3f} | {c['peak_mem_bytes'] / 2**20:.1f} "
            f"| {c['attn_peak_mem_bytes'] / 2**20:.1f} | {_fmt(c['ideal_speedup'], '.2f')} "
            f"| {_fmt(c['measured_speedup'], '.2f')} | {_fmt(c['efficiency'], '.2f')} "
            f"| {_fmt(c['attn_ideal_speedup'], '.2f')} | {_fmt(c['attn_measured_speedup'], '.2f')} "
            f"| {_fmt(c['attn_efficiency'], '.2f')} | {c['attn_cpu_ms']:.2f} | {c['forward_cpu_ms']:.2f} "
            f"| {_fmt(c['attn_cpu_vs_stock'], '.2f')} | {_fmt(c['cpu_efficiency'], '.2f')} "
            f"| {c['throughput_tokens_per_s']:.0f} |"
        )
    return "\n".join(lines) + "\n"


def rows_table(rows: List[dict], columns) -> str:
    """A markdown table of ``rows``: ``columns`` are (header, the cell's text of a row)."""
    lines = ["| " + " | ".join(header for header, _ in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(text(row) for _, text in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


CELL_COLUMNS = [("size", lambda r: r["size"]), ("batch", lambda r: str(r["batch"])), ("len", lambda r: str(r["seq_len"]))]


TRAINING_COLUMNS = [
    *CELL_COLUMNS,
    ("impl", lambda r: "fairseq MHA" if r["impl"] == "fairseq_mha" else "BudgetFormer (all heads, learned budget)"),
    ("train step ms", lambda r: f"{r['train_step_ms']:.1f}"),
    ("tok/s", lambda r: f"{r['train_tokens_per_s']:.0f}"),
    ("time vs stock", lambda r: f"{r['train_vs_stock']:.2f}"),
]
FAIRSEQ_TRAIN_COLUMNS = [
    *CELL_COLUMNS,
    ("precision", lambda r: r["precision"]),
    ("impl", lambda r: "fairseq MHA" if r["impl"] == "fairseq_mha" else "BudgetFormer"),
    ("updates/s", lambda r: f"{r['ups']:.2f}"),
    ("vs stock", lambda r: f"{r['ups_vs_stock']:.2f}"),
]


def _label(cell: dict) -> str:
    if cell["impl"] == "fairseq_mha":
        return "fairseq MHA"
    if cell["budget"] == "static":
        return "static at learned heads"
    return "budget learned" if cell["budget"] == "learned" else f"budget {cell['head_ratio']:.2f}"


def report_markdown(report: dict) -> str:
    text = markdown_table(report["cells"])
    if report["training"]:
        text += ("\nTraining step (forward, backward and AdamW step, train mode, autocast to the dtype):\n\n"
                 + rows_table(report["training"], TRAINING_COLUMNS))
    if report["fairseq_train"]:
        text += "\nfairseq-train, side by side (synthetic data):\n\n" + rows_table(report["fairseq_train"], FAIRSEQ_TRAIN_COLUMNS)
    for c in report["cells"]:
        if "attn_profile" in c:
            text += (f"\nProfile of the attention blocks, {c['size']} batch {c['batch']} len {c['seq_len']}, "
                     f"{_label(c)}:\n\n```\n{c['attn_profile'].rstrip()}\n```\n")
    return text
