"""The reports of results/ are what the code makes of their committed summaries.

A report states measured figures; its study script recomputes every derived number (fits, verdicts, tables) from
the committed summaries (results/harness.py).  If a change to the library or to a script moves any of them, the
committed report no longer says what the code computes: `results/regenerate.py --check` writes every regenerable
report to a temporary folder and compares it byte for byte with the committed one.
"""

import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent / "results"


def test_every_report_regenerates_from_its_summaries():
    result = subprocess.run([sys.executable, str(RESULTS / "regenerate.py"), "--check"], capture_output=True,
                            text=True, check=False, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    assert " reports identical to their regeneration" in result.stderr
