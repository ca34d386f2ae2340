"""--key=value settings, the one parser of every nanospa command: train.py,
python -m nanospa.experiments, python -m nanospa.signal and python -m nanospa.bench.

    parse_settings(argv, defaults, presets=None)  -> dict
    SettingsError                                   a bad flag (one-line message; exit status 2)
    help_text(title, defaults, notes, presets)      the --help screen

A value is read with ast.literal_eval and must have the default's type (a bare word is a
string; an int is accepted where a float is expected). A tuple default takes a
comma-separated list of its element type: --depths=1,4,12 or --lrs=1e-3,3e-3. A bare
--flag sets a bool key to True. --preset=NAME is applied before every other setting,
wherever it stands, so explicit settings win over the preset's.
"""
import ast
import difflib


class SettingsError(ValueError):
    """A bad command-line setting; the message is one line naming the bad value."""


def _literal(raw):
    try:
        return ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return raw


def _scalar(key, raw, value, default):
    if isinstance(default, str):
        return value if isinstance(value, str) else raw
    if isinstance(default, bool):
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        ok = isinstance(value, bool)
    elif isinstance(default, int):
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(default, float):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    else:
        ok = isinstance(value, type(default))
    if not ok:
        raise SettingsError(f"--{key}={raw}: expected {type(default).__name__} like the default {default!r}")
    return value


def convert(key, raw, default, element=None):
    """'--key=raw' -> a value of the default's type. Tuples: comma-separated elements of the
    type of `element` (default: the tuple's first element, else str)."""
    if isinstance(default, tuple):
        proto = element if element is not None else (default[0] if default else "")
        parts = [p.strip() for p in str(raw).strip("()[] ").split(",") if p.strip()]
        return tuple(_scalar(key, raw, _literal(p), proto) for p in parts)
    return _scalar(key, raw, _literal(raw), default)


def parse_settings(argv, defaults, presets=None, elements=None):
    """Apply --key=value overrides to a copy of `defaults`; raises SettingsError.

    presets: {name: {key: value}} for --preset=NAME (only when 'preset' is a key).
    elements: {key: prototype} for tuple keys whose default is empty."""
    settings, pairs = dict(defaults), []
    elements = elements or {}
    for arg in argv:
        key, eq, raw = arg[2:].partition("=")
        if not arg.startswith("--") or not key:
            raise SettingsError(f"unexpected argument {arg!r}: settings look like --key=value")
        if key not in settings:
            close = difflib.get_close_matches(key, list(settings), n=1)
            hint = f"; did you mean --{close[0]}?" if close else "; --help lists the keys"
            raise SettingsError(f"unknown setting --{key}{hint}")
        if not eq and not isinstance(settings[key], bool):
            raise SettingsError(f"--{key} needs a value: --{key}=VALUE")
        pairs.append((key, raw if eq else "True"))
    explicit = set()
    for key, raw in sorted(pairs, key=lambda kv: kv[0] != "preset"):  # stable sort: preset first
        settings[key] = convert(key, raw, defaults[key], elements.get(key))
        explicit.add(key)
        if key == "preset":
            if not presets or settings[key] not in presets:
                raise SettingsError(f"unknown preset {settings[key]!r}; presets: {', '.join(presets or [])}")
            settings.update(presets[settings[key]])
    settings["_explicit"] = explicit
    return settings


def wants_help(argv):
    return any(a in ("-h", "--help", "help") for a in argv)


def help_text(title, defaults, notes=None, presets=None):
    """The --help screen: every key with its default and a one-line note."""
    notes = notes or {}
    lines = [title, "", "settings (--key=value):"]
    for key, value in defaults.items():
        shown = ",".join(str(v) for v in value) if isinstance(value, tuple) else repr(value)
        lines.append(f"  --{key}={shown:<16} {notes.get(key, '')}".rstrip())
    for name, preset in (presets or {}).items():
        lines.append(f"preset {name}: " + " ".join(f"{k}={v}" for k, v in preset.items()))
    return "\n".join(lines)
