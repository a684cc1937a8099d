import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # tests/corpus.py is shared with e2e/
