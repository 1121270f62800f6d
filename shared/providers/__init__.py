"""Provider clients: one small httpx-based client per API shape."""

import sys
import types

# httpx imports its command-line module (`httpx._main`) on import, which pulls in click,
# rich.syntax and pygments: about 50 ms of a CLI run that never uses it. A stand-in module
# without `main` makes httpx fall back to its own no-op, as it does when those are absent.
if "httpx" not in sys.modules:
    sys.modules.setdefault("httpx._main", types.ModuleType("httpx._main"))
