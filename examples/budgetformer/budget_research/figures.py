"""matplotlib for the scripts' figures: headless, optional, written atomically."""

import logging
from pathlib import Path

from budget_plugin.tools.files import atomic_path


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed); None without matplotlib."""
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its font cache notices
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> Path:
    """``fig`` as a PNG at ``path`` (never half-written), then closed."""
    import matplotlib.pyplot as plt

    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return Path(path)
