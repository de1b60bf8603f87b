"""Call 3's hang watch: every Python process (pytest and the ranks it spawns) dumps its stacks after 150 s."""

import faulthandler
import sys

faulthandler.dump_traceback_later(150, exit=False, file=sys.stderr)
