"""What every commpress command shares: one-line errors with exit code 2, tables, JSON."""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from topologies.attrs import GraphError
from topologies.errors import InputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

EXIT_USAGE = 2
EXIT_SIGINT, EXIT_SIGTERM = 130, 143   # 128 + signal number, as shells report them


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that ``finally`` blocks (stopping ranks, removing
    temporary files, rolling a cluster back) run before the command exits."""


def _terminate(signum, frame):
    raise Terminated()


class DefaultsFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and epilogs as written; every option's default in its help, unless the
    help already says it or there is none to say."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if "default" in text.lower() or default in (None, False, argparse.SUPPRESS) or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error (no usage dump), exit code 2, ``--version`` on every
    command and subcommand, and defaults shown in ``--help``."""

    def __init__(self, *args, **kwargs):
        if kwargs.get("formatter_class") in (None, argparse.RawDescriptionHelpFormatter, argparse.HelpFormatter):
            kwargs["formatter_class"] = DefaultsFormatter
        super().__init__(*args, **kwargs)
        from importlib.metadata import PackageNotFoundError, version

        try:
            text = version("commpress")
        except PackageNotFoundError:      # run from a source tree that was never installed
            text = "unknown"
        self.add_argument("--version", action="version", version=f"%(prog)s (commpress) {text}")

    also_required = ""      # an argument argparse cannot require (it may come another way), named with the rest

    def error(self, message):
        lead = "the following arguments are required: "
        if self.also_required and message.startswith(lead):
            message = lead + self.also_required + ", " + message[len(lead):]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def run(main, argv=None) -> int:
    """Call ``main(argv)``; bad input becomes one line on stderr and exit code 2, SIGINT and
    SIGTERM one line and 130 / 143 (after the command's own clean-up has run). The last-resort
    cases (nesting too deep, a file that is not UTF-8, an OS error, memory) are one line too;
    they back up the checks each command makes, they do not replace them."""
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if main_thread else None
    try:
        return main(argv) or 0
    except (InputError, GraphError) as err:
        return _fail(str(err))
    except BrokenPipeError:
        return 0
    except KeyboardInterrupt:
        return _fail("interrupted", EXIT_SIGINT)
    except Terminated:
        return _fail("terminated", EXIT_SIGTERM)
    except RecursionError:
        return _fail("input nested too deeply to read")
    except UnicodeDecodeError as err:
        return _fail(f"input is not UTF-8 text ({err.reason} at byte {err.start})")
    except MemoryError:
        return _fail("not enough memory for this input: choose smaller sizes")
    except OSError as err:
        return _fail(f"{err.filename or 'file'}: {err.strerror or err}")
    finally:
        if main_thread and previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _fail(message: str, code: int = EXIT_USAGE) -> int:
    prog = sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "commpress"
    print(f"{prog}: error: {message}" if code == EXIT_USAGE else f"{prog}: {message}", file=sys.stderr)
    return code


def table(headers, rows, title: str | None = None) -> str:
    """Fixed-width text table; numbers right-aligned, text left-aligned."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) if rows else False
               for i in range(len(headers))]

    def line(values):
        return "  ".join(v.rjust(w) if num else v.ljust(w)
                         for v, w, num in zip(values, widths, numeric)).rstrip()

    out = [title] if title else []
    out += [line(headers), line(["-" * w for w in widths])] + [line(r) for r in cells]
    return "\n".join(out)


def _cell(value) -> str:
    if isinstance(value, float):
        if math.isinf(value) or math.isnan(value):
            return str(value)
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.3g}"
        return f"{value:.2f}" if abs(value) >= 10 else f"{value:.3f}"
    return str(value)


def dump_json(obj) -> str:
    return json.dumps(obj, indent=2, default=_jsonable, allow_nan=True)


def _jsonable(obj):
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def check_writable(path: str, field: str = "output") -> str:
    """Refuse, before any work is done, an output path that is empty, is a folder, or whose folder
    is missing, is no folder or does not take a new file (tried for real: permissions alone do not
    tell for /proc or a read-only mount). A command whose output is a folder it creates passes that
    folder's path (or, where the folder exists, the path of a file it writes there): every message
    says what is wrong with the path as given, true of a file and of a folder to be created."""
    if not isinstance(path, str) or not path.strip():
        raise InputError(field, path, "a path (it is empty)")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        why = "is no folder" if os.path.lexists(folder) else "does not exist"
        raise InputError(field, path, f"a path in an existing folder ({folder} {why})")
    if os.path.isdir(path):
        raise InputError(field, path, "a file path, not a folder")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".tmp-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise InputError(field, path, f"a path in a writable folder ({folder} takes no new file: "
                         f"{err.strerror})") from None
    return path


def gpu_keys() -> tuple[str, ...] | None:
    """The GPUs a cluster file may name (its ``gpu``): the keys of the model's GPU catalog,
    ``perfmodel/catalog/gpus.toml``, read as data (topologies imports nothing of perfmodel);
    None where perfmodel is not installed beside it."""
    spec = importlib.util.find_spec("perfmodel")
    if spec is None or spec.origin is None:
        return None
    return tuple(tomllib.loads((Path(spec.origin).parent / "catalog" / "gpus.toml").read_text()))


def check_gpu(key: str) -> str:
    """``key`` if the model knows the GPU (``gpu_keys``), else InputError naming the GPUs it knows:
    ``topologies show``, ``export`` and ``draw``'s check, in the words of perfmodel's own
    (``perfmodel.devices.device``, which reads the same catalog)."""
    known = gpu_keys()
    if known is not None and key not in known:
        raise InputError("gpu", key, "one of " + ", ".join(known))
    return key


# keys a Hugging Face transformers config.json has (its class, and the widths of GPT-2 and of the rest)
HF_CONFIG_KEYS = ("architectures", "model_type", "n_embd", "n_layer", "hidden_size", "num_hidden_layers")


def file_format(text: str) -> str | None:
    """What a file that is not TOML looks like: ``a Hugging Face config.json (model_type 'gpt2')``,
    ``JSON`` or ``YAML``; None where it looks like none of them (broken TOML, say)."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            data = None
        if isinstance(data, dict) and any(key in data for key in HF_CONFIG_KEYS):
            kind = data.get("model_type")
            return "a Hugging Face config.json" + (f" (model_type {kind!r})" if isinstance(kind, str) else "")
        if data is not None:
            return "JSON"
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if lines and (lines[0].strip() == "---" or re.match(r"[\w.-]+:(\s|$)", lines[0])):
        return "YAML"
    return None


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: an integer >= 1")
    return value


def atomic_write(path: str, write) -> str:
    """Write through a temporary file in the same folder, then rename: never half a file."""
    check_writable(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


class Progress:
    """A progress bar on stderr: redrawn in place on a terminal; elsewhere (a log, a pipe) one
    line when the work is done, so logs hold one line per long job, not one per case."""

    def __init__(self, label: str, stream=None, width: int = 30):
        self.label, self.stream, self.width = label, stream or sys.stderr, width
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._start = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        frac = done / total if total else 1.0
        if self.tty:
            bar = "#" * int(frac * self.width)
            self.stream.write(f"\r{self.label} [{bar:<{self.width}}] {done}/{total}")
            if done >= total:
                self.stream.write("\n")
        elif done >= total:
            self.stream.write(f"{self.label}: {done}/{total} in {time.perf_counter() - self._start:.1f} s\n")
        self.stream.flush()
