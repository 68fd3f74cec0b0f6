"""The one import root `repro` (issue 68): the old top-level names import as the very modules
they became, submodules too, and their command lines still run."""

import os
import subprocess
import sys
import unittest

PYTHON_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def run_python(*args):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=PYTHON_DIR)


class OldNamesTest(unittest.TestCase):
    def test_each_old_name_is_the_module_it_became(self):
        out = run_python("-c", """
import repro_trace, repro_writer, repro.trace, repro.writer
assert repro_trace is repro.trace and repro_writer is repro.writer
from repro_writer import TraceWriter
assert TraceWriter is repro.writer.TraceWriter
print(repro_trace.__spec__.name, repro_writer.__name__)
""")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["repro.trace", "repro.writer"])

    def test_a_submodule_under_an_old_name_is_not_loaded_twice(self):
        out = run_python("-c", """
import sys
import repro_study.modes as old
import repro.study.modes as new
assert old is new, (old, new)
assert sys.modules["repro_study.modes"] is new
print(new.__spec__.name, len({id(m) for m in sys.modules.values() if getattr(m, "__file__", None) == new.__file__}))
""")
        if "No module named 'torch'" in out.stderr:
            self.skipTest("torch is not installed")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), ["repro.study.modes", "1"])

    def test_an_unknown_submodule_of_an_old_name_is_still_an_import_error(self):
        out = run_python("-c", "import repro_writer.nothing_here")
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("No module named 'repro_writer.nothing_here'", out.stderr)

    def test_the_old_command_lines_still_run(self):
        reader = run_python("repro_trace.py", "--help")
        self.assertEqual(reader.returncode, 0, reader.stderr)
        self.assertIn("usage: python -m repro.trace", reader.stdout)
        new = run_python("-m", "repro.trace", "verify", "/nonexistent/trace")
        old = run_python("repro_trace.py", "verify", "/nonexistent/trace")
        self.assertEqual((old.returncode, old.stdout), (new.returncode, new.stdout))
        self.assertEqual(new.returncode, 2)


if __name__ == "__main__":
    unittest.main()
