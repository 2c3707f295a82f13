"""``--set PATH=VALUE`` overrides of a pipeline
(:meth:`gfcr.core.pipeline.Pipeline.with_overrides`), applied to its dict form before it is
validated again.

The path is a settable pipeline field (``steps``), a component (``engine=vllm``: that
type with its defaults; ``engine.max_model_len=512``), a settings section
(``evaluation``, ``checkpoint``, ``reward_range``, ``learner``) or a stage by name
(``grpo.lr``), then nested fields; the value is YAML, read by :mod:`gfcr.config.yamlfile`'s
bounded loader. Every problem is collected, none raised, so a command line with several
wrong assignments is answered once.
"""

from __future__ import annotations

from typing import Any

from gfcr.config import yamlfile


def apply(data: dict[str, Any], assignment: str, problems: list[str], *,
          components: tuple[str, ...], fields: frozenset[str]) -> None:
    """Apply ``assignment`` (``PATH=VALUE``) to ``data``, a pipeline's dict form, or add
    what is wrong with it to ``problems``. ``components`` are the component fields
    (``engine=vllm`` picks a type), ``fields`` the pipeline's fields."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path:
        problems.append(f"{assignment!r}: expected PATH=VALUE, e.g. grpo.lr=1e-3")
        return
    try:
        value = yamlfile.load(raw, where=f"--set {path}") if raw else ""
    except yamlfile.YamlRefused as e:
        problems.append(f"{path!r}: value {raw[:80]!r} is not valid YAML ({e.problem}); quote it, "
                        f"e.g. --set '{path}=\"...\"'")
        return
    head, _, field = path.partition(".")
    if not field and head in components and isinstance(value, str):
        data[head] = {"type": value}  # engine=vllm: that component type, its defaults
        return
    if not field:
        if head not in fields or head in components or head == "stages":
            problems.append(f"{path!r}: not a settable pipeline field "
                            f"(use a component or stage name followed by .field)")
        else:
            data[head] = value
        return
    target = _target(data, head, components)
    if target is None:
        names = [s.get("name") or s.get("type") for s in data["stages"]]
        problems.append(f"{path!r}: no component or stage named {head!r}; stages: "
                        f"{', '.join(names)}; components: {', '.join(components)}, evaluation, "
                        "checkpoint, reward_range, learner")
        return
    _set_nested(target, field.split("."), value)


def _target(data: dict[str, Any], head: str, components: tuple[str, ...]
            ) -> dict[str, Any] | None:
    if head in (*components, "evaluation", "checkpoint"):
        return data[head]
    if head in ("reward_range", "learner"):  # stored only when set: defaults fill the rest
        return data.setdefault(head, {})
    for s in data["stages"]:
        if (s.get("name") or s.get("type")) == head:
            return s
    return None


def _set_nested(target: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        if not isinstance(target.get(key), dict):  # unset (None) options get their fields
            target[key] = {}
        target = target[key]
    target[keys[-1]] = value
