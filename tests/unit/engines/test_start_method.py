"""Start methods in this process: DataLoader's default whatever threads run, and how a main
script's top-level code is told from code under ``if __name__ == "__main__":`` (the scripts
themselves, in fresh interpreters: tests/system/engines/test_start_method.py)."""

import sys
import types

import asyncloader._engines.start_method as start_method
from asyncloader._engines.start_method import _guarded_lines, _is_main_test


def test_default_start_method_is_multiprocessings_default(monkeypatch):
    """No start method named: multiprocessing's default, as DataLoader (fork on Linux before
    3.14), or the one set with set_start_method."""
    import multiprocessing

    expected = (
        multiprocessing.get_start_method(allow_none=True)
        or (multiprocessing.get_all_start_methods()[0])
    )
    assert start_method.default_mp_context().get_start_method() == expected
    monkeypatch.setattr(multiprocessing, "get_start_method", lambda allow_none=False: "spawn")
    assert start_method.default_mp_context().get_start_method() == "spawn"


def test_main_guard_detection():
    """Only `if __name__ == "__main__":` at top level (either way round) counts as a guard."""
    import ast

    def test_of(src):
        return ast.parse(src).body[0].test

    assert _is_main_test(test_of('if __name__ == "__main__": pass'))
    assert _is_main_test(test_of('if "__main__" == __name__: pass'))
    assert not _is_main_test(test_of('if __name__ != "__main__": pass'))
    assert not _is_main_test(test_of("if x == '__main__': pass"))


def test_guarded_lines_cover_the_whole_block(tmp_path):
    """Every line of a main block counts as guarded, none outside it."""
    script = tmp_path / "s.py"
    script.write_text('a = 1\nif __name__ == "__main__":\n    b = 2\n    c = 3\nd = 4\n')
    assert _guarded_lines(str(script)) == frozenset({2, 3, 4})


def test_a_call_from_a_main_scripts_top_level_names_its_line(tmp_path, monkeypatch):
    """unguarded_main_line names ``path:line`` for a call from the main script's top-level
    code, and nothing for one under its ``__main__`` guard or without a main script file."""
    script = tmp_path / "train.py"
    script.write_text("top = where()\nif __name__ == '__main__':\n    guarded = where()\n")
    main = types.ModuleType("__main__")
    main.__file__ = str(script)
    main.where = lambda: start_method.unguarded_main_line()  # a frame between
    monkeypatch.setitem(sys.modules, "__main__", main)
    exec(compile(script.read_text(), str(script), "exec"), vars(main))
    assert (main.top, main.guarded) == (f"{script}:1", None)
    monkeypatch.delattr(main, "__file__")
    assert start_method.unguarded_main_line() is None
