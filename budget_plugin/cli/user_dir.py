"""Print the plugin's folder, what fairseq's ``--user-dir`` takes, wherever pip put it:

    fairseq-validate DATA --user-dir "$(budget-user-dir)" --task budget_sentence_prediction ...
"""

import sys
from pathlib import Path


def main(argv=None) -> int:
    if argv if argv is not None else sys.argv[1:]:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    import budget_plugin

    print(Path(budget_plugin.__file__).resolve().parent)
    return 0
