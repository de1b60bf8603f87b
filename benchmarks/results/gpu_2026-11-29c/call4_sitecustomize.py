import faulthandler
import sys

faulthandler.dump_traceback_later(85, exit=False, file=sys.stderr)
