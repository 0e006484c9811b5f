from __future__ import annotations

from flowlane.cli import entry

entry()
