"""xpk's own command-line parser, without xpk's cloud clients: `python tests/xpk_parse.py XPK_DIR` reads a JSON list
of argument lists (each what follows `xpk` on a command line) on stdin and prints, for each, a JSON line:
{"ok": true, "args": {dest: value, ...}} or {"ok": false, "code": N, "error": "xpk's usage message"}. Used by
`tests/test_xpk.py`.

XPK_DIR holds xpk 1.16.0 installed with `--no-deps` and the few small packages its parser modules import
(`.ci/xpk_env`). The parser is xpk's: `xpk.parser.core.set_parser` on an `argparse.ArgumentParser(prog="xpk")`,
as `xpk.main.main` builds it. Importing it also imports xpk's command implementations (the functions a parsed
command calls), and they import Kubernetes, Google Cloud and Docker clients: those packages (`CLIENTS`) are
placeholders here, modules whose every attribute is a placeholder class. The parser never uses them: no flag's
`type`, `choices` or action comes from them (checked below), so what the parser accepts is xpk's alone.
"""

import argparse
import importlib.abc
import importlib.machinery
import json
import sys
import types

CLIENTS = ("kubernetes", "google.cloud", "google.api_core", "docker")


def _is_client(name: str) -> bool:
    return any(name == c or name.startswith(c + ".") for c in CLIENTS)


class _Placeholder(type):
    """A placeholder class: an exception type (so that `except` and subclassing work), callable, whose every
    attribute is another placeholder class."""

    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (Exception,), {"__module__": cls.__module__})


class _ClientModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder(name, (Exception,), {"__module__": self.__name__})


class _ClientFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers every import of a `CLIENTS` package or module with a placeholder module."""

    def find_spec(self, name, path=None, target=None):
        return importlib.machinery.ModuleSpec(name, self, is_package=True) if _is_client(name) else None

    def create_module(self, spec):
        module = _ClientModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


def xpk_parser(xpk_dir: str) -> argparse.ArgumentParser:
    sys.path.insert(0, xpk_dir)
    sys.meta_path.insert(0, _ClientFinder())
    from xpk.parser.core import set_parser

    parser = argparse.ArgumentParser(description="xpk command", prog="xpk")
    set_parser(parser=parser)
    for action in _actions(parser):
        for used in (action.type, type(action), *(action.choices or ())):
            module = getattr(used, "__module__", None) or ""
            assert not _is_client(module), f"{action.option_strings}: {used!r} comes from a placeholder"
    return parser


def _actions(parser: argparse.ArgumentParser):
    for action in parser._actions:  # argparse keeps a parser's actions and subparsers here only
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _actions(sub)
        else:
            yield action


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> dict:
    errors = []
    parser_error = argparse.ArgumentParser.error

    def error(self, message):  # keep the message (argparse prints it and exits 2)
        errors.append(f"{self.prog}: error: {message}")
        parser_error(self, message)

    argparse.ArgumentParser.error = error
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return {"ok": False, "code": e.code, "error": "\n".join(errors)}
    finally:
        argparse.ArgumentParser.error = parser_error
    plain = (str, int, float, bool, type(None), list)
    return {"ok": True, "args": {k: v for k, v in vars(args).items() if isinstance(v, plain)}}


def main() -> None:
    parser = xpk_parser(sys.argv[1])
    for argv in json.load(sys.stdin):
        print(json.dumps(parse(parser, argv)), flush=True)


if __name__ == "__main__":
    main()
