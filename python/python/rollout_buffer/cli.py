"""The ``rollout-buffer`` console script: the server and tools of the Rust binary, run in
this process by the extension (installed with the package, no separate ``cargo install``)::

    rollout-buffer serve --store ./run --listen 127.0.0.1:8889 --group-size 8
    rollout-buffer inspect ./run --tail 5
    rollout-buffer repair ./run

``python -m rollout_buffer.cli ...`` is the same. The arguments and behaviour are the
binary's (``docs/server.md``); SIGTERM or Ctrl-C stop ``serve`` gracefully (it flushes the
buffer and exits 0).
"""

from __future__ import annotations

import signal
import sys
from typing import List, Optional

from . import _native


def main(argv: Optional[List[str]] = None) -> None:
    """Runs the command line (``sys.argv`` by default) and exits with its code."""
    args = sys.argv[1:] if argv is None else list(argv)
    # The server handles SIGINT itself (a graceful stop, exit 0). Python's own handler
    # would then raise KeyboardInterrupt once the call returns, turning that clean stop
    # into a traceback, so the signal is left to the server alone.
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_native.cli_main(["rollout-buffer", *args]))


if __name__ == "__main__":
    main()
