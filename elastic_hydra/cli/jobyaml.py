"""The job file of a command, as `--plan` shows it for a torchrun-style command: the command can be
committed as a file, and `elastic-hydra FILE` (launched from the same directory: relative paths
stay relative to where you launch) runs the same plan.

Built by difference, not by a second translation: the command's composed config against the base
job composed with the same config-group choices. The file holds the groups that differ from
elastic_hydra_base's (as `override` entries of its defaults list), every key whose value differs
(the words after the script among them, as `args`), and the `hydra.*` overrides given. Secret
values are masked, as in every file we write.
"""

from __future__ import annotations

import shlex
from typing import Any

from elastic_hydra.config import boundary
from elastic_hydra.config.boundary import JobContext
from elastic_hydra.config.composed import Composed, to_yaml
from elastic_hydra.config.invocation import Invocation, job_flags
from elastic_hydra.redact import redact, redact_override

_SAME = object()  # `_changes` found no difference


def job_yaml(inv: Invocation, cfg: Composed, ctx: JobContext) -> str:
    """The YAML of a job file equivalent to the command `inv` (composed as `cfg`, `ctx`).

    With a job file in the command, the keys and group choices to add to that file instead.

    Raises:
        HydraException, OmegaConfBaseException: the base job does not compose.
    """
    base = Invocation(flags=tuple(job_flags(inv.job)), job=inv.job)
    groups = _changed_groups(ctx.hydra_cfg, boundary.compose(base)[1].hydra_cfg)
    chosen = tuple(f"{group}={option}" for group, option in groups.items())
    reference, _ = boundary.compose(Invocation(flags=base.flags, overrides=chosen, job=inv.job))
    keys = _changes(cfg.unresolved(), reference.unresolved())
    doc: dict[str, Any] = {}
    overrides = [{f"override {group}": option} for group, option in groups.items()]
    if inv.job is None:
        doc["defaults"] = ["elastic_hydra_base", *overrides, "_self_"]
    doc.update(keys if isinstance(keys, dict) else {})
    hydra_keys = _hydra_overrides(inv, ctx)
    if hydra_keys:
        doc["hydra"] = hydra_keys
    body = to_yaml(redact(doc))
    return _header(inv, [f"  - override {g}: {o}" for g, o in groups.items()]) + body


def _header(inv: Invocation, group_lines: list[str]) -> str:
    words = [redact_override(w) for w in inv.words if w != "--plan" and not w.startswith("--plan=")]
    lines = [f"# elastic-hydra job for: elastic-hydra {shlex.join(words)}"]
    if inv.job is None:
        lines += [
            "# Save it (elastic-hydra --plan=yaml ... > job.yaml) and run it from this directory:",
            "#   elastic-hydra job.yaml",
        ]
    else:
        lines.append(f"# The keys this command adds to {inv.job}; merge them into it.")
        if group_lines:
            lines += ["# Its defaults list also needs:", *(f"# {line}" for line in group_lines)]
    return "\n".join(lines) + "\n"


def _changed_groups(hydra_cfg: dict[str, Any], base: dict[str, Any]) -> dict[str, str]:
    """Our config groups (rdzv, restart, logs...) whose option differs from the base job's."""
    choices, defaults = hydra_cfg["runtime"]["choices"], base["runtime"]["choices"]
    return {
        group: option
        for group, option in choices.items()
        if not group.startswith("hydra/") and option is not None and option != defaults.get(group)
    }


def _changes(new: Any, old: Any) -> Any:
    """What of `new` differs from `old`: mappings key by key, anything else as a whole."""
    if isinstance(new, dict) and isinstance(old, dict):
        out = {}
        for key, value in new.items():
            changed = _changes(value, old[key]) if key in old else value
            if changed is not _SAME:
                out[key] = changed
        return out or _SAME
    return _SAME if type(new) is type(old) and new == old else new


def _hydra_overrides(inv: Invocation, ctx: JobContext) -> dict[str, Any]:
    """The `hydra.*` overrides of the command, nested, with the values Hydra composed."""
    nested: dict[str, Any] = {}
    for override in inv.overrides:
        key = override.partition("=")[0].lstrip("+~")
        if not key.startswith("hydra."):
            continue
        value: Any = ctx.hydra_cfg
        for part in key.split(".")[1:]:
            value = value.get(part) if isinstance(value, dict) else None
        node = nested
        *parents, last = key.split(".")[1:]
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return nested
