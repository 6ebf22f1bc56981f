"""A launch script's training arguments, read without running it (``perfmodel.importers.megatron``).

What the example launch scripts of Megatron-LM use, followed as bash would: line continuations,
comments, ``NAME=value`` and ``export NAME=value`` (``${NAME:-default}``, ``$((a*b))``), arrays
``NAME=( ... )`` and ``NAME+=( ... )`` expanded by ``${NAME[@]}`` (an element "--flag value" split in
two, as an unquoted expansion splits it), and ``if`` / ``elif`` / ``else`` / ``fi`` on ``[ ]`` and
``[[ ]]`` tests of strings (``==``, ``=``, ``!=``, ``-n``, ``-z``, ``||``, ``&&``), and ``case WORD in
PATTERN) ... ;; esac`` (glob patterns, ``a|b``). A variable the script does not set is the
environment's, as bash has it (``TP=8 perfmodel import megatron:train.sh``; ``Script.from_env`` lists
them); one neither sets (a positional ``$1``, a file it ``source``s: not read, ``Script.sourced``)
expands to an ``UNSET`` mark: a test sees it empty, as bash does; a flag whose value holds one is
refused naming the variable. A command substitution (``$(...)``, backquotes) is not run: its mark is
``COMMAND``. The arguments are those after the first ``*.py`` of the first line that runs one
(``torchrun ... pretrain_gpt.py ...``, also inside a command kept in a variable, ``CMD="python
pretrain_gpt.py $ARGS"``), where flags or unset variables follow it; a file without such a line is
an argument list itself.
"""
from __future__ import annotations

import fnmatch
import os
import re
import shlex

from perfmodel.importers.common import UNSET, UNSET_RE, bounded_eval

_VAR = re.compile(r"\$(?:\{(\w+)(\[@\]|\[\*\])?(?::?-([^}]*))?\}|(\w+))")
_ARITH = re.compile(r"\$\(\(((?:[^()]|\((?:[^()]|\([^()]*\))*\))*)\)\)")     # $((...)), two levels of (...)
_PATTERN = re.compile(r"^\(?\s*([^()=\s][^()=]*?)\s*\)(.*)$")     # a case branch: PATTERN) [statement]
EMPTY = "\x00EMPTY\x00"       # an empty array's "${A[@]}": no word at all
_SOURCE = re.compile(r"^(?:source|\.)\s+\S")       # source FILE / . FILE
_ASSIGN = re.compile(r"^(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?(\w+)(\+?=)(.*)$", re.S)


def unset_names(text: str) -> list[str]:
    """The unset variables ``text`` holds (their marks from ``expand``)."""
    return UNSET_RE.findall(text)


class Script:
    """The variables, arrays and launch arguments of one script (module doc)."""

    def __init__(self, text: str, env: dict | None = None):
        self.vars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.args: list[str] | None = None
        self.env = dict(os.environ if env is None else env)
        self.from_env: dict[str, str] = {}       # the environment's variables the script read
        self.sourced: list[str] = []             # the files it sources (not read)
        self.unset_args: list[str] | None = None  # a *.py run with unset variables only (``CMD=... $ARGS``)
        self._run(_logical_lines(text))

    def expand(self, text: str) -> str:
        """``text`` with ``$((...))``, ``$NAME``, ``${NAME}``, ``${NAME:-default}`` and ``${NAME[@]}``
        replaced (an array by its elements quoted for shlex; an unset name by its UNSET mark)."""
        while "$(" in text and "$((" not in text and re.search(r"\$\([^()]*\)", text):   # innermost first
            text = re.sub(r"\$\(([^()]*)\)", UNSET.format("COMMAND").replace("\\", "\\\\"), text)
        text = re.sub(r"`[^`]*`", UNSET.format("COMMAND"), text)
        text = _VAR.sub(lambda m: self._one(m, _in_double_quotes(text, m.start())), text)
        return _ARITH.sub(lambda m: _arith(m.group(1)), text)

    def _one(self, m, quoted: bool = False) -> str:
        name, array, default = m.group(1) or m.group(4), m.group(2), m.group(3)
        if array and quoted:            # "${A[@]}": a word an element, as bash has it; none for an empty array
            elements = self.arrays.get(name, [])
            return '" "'.join(re.sub(r'(["\\$`])', r"\\\1", e) for e in elements) if elements else EMPTY
        if array:
            return " ".join(_quote(e) for e in self.arrays.get(name, []))
        if name in self.arrays:
            return _quote(self.arrays[name][0]) if self.arrays[name] else ""
        if name in self.vars and (self.vars[name] or default is None):
            return self.vars[name]
        if name in self.env and not name.isdigit() and (self.env[name] or default is None):
            self.from_env[name] = self.env[name]
            return self.env[name]
        if default is not None:
            return " ".join(_words(self.expand(default)))
        return UNSET.format(name)

    def _run(self, lines: list[str]) -> None:
        active = [True]          # each enclosing if's (or case's) branch taken
        taken = [True]           # whether a branch of each enclosing if or case was taken already
        cases = [None]           # the word of each enclosing case (None: an if)
        i = 0
        while i < len(lines):
            line = lines[i].strip()
            i += 1
            head = line.split(None, 1)[0] if line else ""
            if head in ("if", "elif"):
                cond = self._test(line.split(None, 1)[1].rsplit("then", 1)[0].rstrip("; "))
                if head == "if":
                    active.append(all(active) and cond)
                    taken.append(cond)
                    cases.append(None)
                else:
                    active[-1] = not taken[-1] and cond
                    taken[-1] = taken[-1] or cond
            elif head == "else":
                active[-1], taken[-1] = not taken[-1], True
            elif head == "case" and line.endswith(" in"):
                active.append(False)
                taken.append(False)
                cases.append(" ".join(_words(self.expand(line[4:-3]))))
            elif head in ("fi", "esac") and len(active) > 1:
                active.pop()
                taken.pop()
                cases.pop()
            elif cases[-1] is not None and _PATTERN.match(line):
                pattern, rest = _PATTERN.match(line).groups()
                hit = not taken[-1] and any(fnmatch.fnmatchcase(cases[-1], p) for p in
                                            _words(self.expand(pattern.replace("|", " "))))
                active[-1], taken[-1] = hit, taken[-1] or hit
                if hit and all(active) and rest.strip(" ;"):
                    i = self._statement(rest.strip().removesuffix(";;").strip(), lines, i)
            elif all(active) and line and line != ";;":
                i = self._statement(line.removesuffix(";;").strip() if cases[-1] is not None else line, lines, i)

    def _statement(self, line: str, lines: list[str], i: int) -> int:
        if _SOURCE.match(line):
            words = _words(self.expand(line.split(None, 1)[1]))
            self.sourced.append(UNSET_RE.sub(r"$\1", words[0]) if words else "")
            return i
        m = _ASSIGN.match(line)
        if m and m.group(3).lstrip().startswith("("):
            body = m.group(3).lstrip()[1:]
            while _array_end(body) < 0 and i < len(lines):
                body += "\n" + lines[i]
                i += 1
            end = _array_end(body)
            words = [w for part in (body[:end] if end >= 0 else body).split("\n")
                     for w in _words(self.expand(part))]
            self.arrays[m.group(1)] = (self.arrays.get(m.group(1), []) if m.group(2) == "+=" else []) + words
        elif m:
            words = _words(self.expand(m.group(3)))
            self.vars[m.group(1)] = " ".join(words) if words else ""
            self._launch(_words(self.vars[m.group(1)]))      # a command kept in a variable (TRAINING_CMD="...")
        else:
            self._launch(_words(self.expand(line)))
        return i

    def _launch(self, words: list[str]) -> None:
        """The arguments after the first ``*.py`` of ``words`` (the first such with flags, or variables the
        script does not set, after it; a quoted command, ``sh -c "python x.py ..."``, looked into)."""
        if self.args is None and len(words) > 1 and any(" " in w and ".py" in w for w in words):
            words = [part for w in words for part in (_words(w) if " " in w and ".py" in w else [w])]
        scripts = [k for k, w in enumerate(words) if w.endswith(".py")]
        after = words[scripts[0] + 1:] if scripts else []
        if self.args is None and any(w.startswith("--") for w in after):
            self.args = _split_flags(after)
        elif self.unset_args is None and any(UNSET_RE.fullmatch(w) for w in after):
            self.unset_args = after        # the arguments only where no line runs a *.py with flags

    def _test(self, text: str) -> bool:
        """A ``[ ]`` / ``[[ ]]`` string test (unset variables empty, as bash has them)."""
        for sep, join in ((" || ", any), (" && ", all)):
            if sep in text:
                return join(self._test(part) for part in text.split(sep))
        words = [UNSET_RE.sub("", w) for w in _words(self.expand(text.strip()))]
        words = [w for w in words if w not in ("[", "]", "[[", "]]")]
        if len(words) == 2 and words[0] in ("-n", "-z"):
            return bool(words[1]) == (words[0] == "-n")
        if len(words) == 3 and words[1] in ("==", "=", "!="):
            return (words[0] == words[2]) == (words[1] != "!=")
        return False


def read_args(text: str, env: dict | None = None) -> list[str]:
    """The training arguments of a launch script, or of an argument list (module doc)."""
    return read_script(text, env)[0]


def read_script(text: str, env: dict | None = None) -> tuple[list[str], Script]:
    """The training arguments of a launch script or an argument list, and the Script read (its
    ``from_env`` and ``sourced``)."""
    script = Script(text, env)
    if script.args is not None or script.unset_args is not None:
        return script.args if script.args is not None else script.unset_args, script
    return _split_flags([w for line in _logical_lines(text) for w in _words(script.expand(line))]), script


def _logical_lines(text: str) -> list[str]:
    """The script's lines, continuations joined, and a quoted string over several lines one line."""
    out, pending = [], ""
    for line in text.replace("\\\r\n", " ").replace("\\\n", " ").splitlines():
        pending = f"{pending}\n{line}" if pending else line
        if not _open_quote(pending):
            out.append(pending)
            pending = ""
    return out + ([pending] if pending else [])


def _open_quote(text: str) -> bool:
    lex = shlex.shlex(text, posix=True)
    lex.whitespace_split, lex.commenters = True, "#"
    try:
        list(lex)
    except ValueError:
        return True
    return False


def _words(text: str) -> list[str]:
    lex = shlex.shlex(text, posix=True)
    lex.whitespace_split, lex.commenters = True, "#"
    try:
        return [w for w in lex if w != EMPTY]
    except ValueError:                 # an unclosed quote: the words before it
        return text.split("#", 1)[0].split()


def _in_double_quotes(text: str, pos: int) -> bool:
    """Whether ``text[pos]`` stands inside a double-quoted string (quotes and backslashes followed as bash's)."""
    quote, k = None, 0
    while k < pos:
        c = text[k]
        if c == "\\" and quote != "'":
            k += 2
            continue
        if c in "'\"" and quote in (None, c):
            quote = None if quote else c
        k += 1
    return quote == '"'


def _array_end(body: str) -> int:
    """The index of the ``)`` that closes an array's body (quotes and comments followed), or -1."""
    quote, k = None, 0
    while k < len(body):
        c = body[k]
        if c == "\\" and quote != "'":
            k += 2
            continue
        if quote is None and c == "#" and (k == 0 or body[k - 1].isspace()):
            k = body.find("\n", k)
            if k < 0:
                return -1
            continue
        if c in "'\"" and quote in (None, c):
            quote = None if quote else c
        elif c == ")" and quote is None:
            return k
        k += 1
    return -1


def _quote(word: str) -> str:
    """``word`` as one shlex word, bare where it needs no quotes (so that ``"${ARGS[@]}"``, inside double
    quotes, keeps no quote characters: an unset mark or a flag is bare)."""
    return word if word and not re.search(r"[\s'\"\\#;&|<>()`$]", word) else shlex.quote(word)


def _split_flags(words: list[str]) -> list[str]:
    """``words`` with each "--flag value" word split in two (an unquoted array element's)."""
    return [part for w in words for part in (w.split() if w.startswith("--") and " " in w else [w])]


def _arith(expr: str) -> str:
    """``$((expr))`` of integers (+ - * /), else the ARITHMETIC mark (a flag holding it is refused)."""
    try:
        value = bounded_eval(expr.replace("$", ""))
    except ValueError:
        return UNSET.format("ARITHMETIC")
    return str(value) if isinstance(value, int) else UNSET.format("ARITHMETIC")
