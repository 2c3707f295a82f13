"""An environment module whose ``load_environment`` raises."""

from typing import Any


def load_environment(**args: Any) -> Any:
    raise RuntimeError(f"cannot load with {args}")
