"""python -m nanospa.plot OUT_DIR [OUT_DIR ...] [--out=run.png]: the picture of training runs
(nanospa/plot/__init__.py)."""
import sys

from ..run.settings import SettingsError, fail, need_matplotlib, run_command
from . import check_picture, draw, runs


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or any(a in ("-h", "--help") for a in argv):
        print(__doc__.strip())
        return 0 if argv else 2
    folders = [a for a in argv if not a.startswith("--")]
    options = [a for a in argv if a.startswith("--")]
    out = "run.png"
    for o in options:
        key, _, value = o[2:].partition("=")
        if key != "out" or not value:
            return fail(f"unknown setting {o}: the settings are --out=FILE.png")
        out = value

    def plot():
        if not folders:
            raise SettingsError("name at least one out_dir of a train.py run")
        need_matplotlib("python -m nanospa.plot")
        check_picture(out)                         # the file it says it writes, before any log is read
        found = runs(folders)                      # every log read before anything is drawn
        draw(found, out)
        print(f"wrote {out}: {', '.join(name for name, _ in found)}")
        return 0
    return run_command(plot)


if __name__ == "__main__":
    sys.exit(main())
