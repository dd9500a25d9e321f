"""Approval modes; plan mode read-only by the operating system, the classifiers only early."""

from __future__ import annotations

import pytest

from agent.gates import node_write, python_write, shell_write


WRITES_SHELL = ["echo hi > out.txt", "rm -rf build", "git commit -m x", "sed -i s/a/b/ f",
                "python3 -c \"open('f','w').write('x')\"", "find . -name '*.pyc' -delete",
                "env FOO=1 rm x", "cat <<EOF > f\nhello\nEOF", "ls\nrm x", "pip install -e .",
                "bash -c 'touch x'", "echo x | tee out", "echo $(rm x)", "timeout 5 mv a b",
                "python3 - <<'EOF'\nimport os\nos.remove('x')\nEOF", "npm install"]
READS_SHELL = ["ls -la", "echo $((x >> 16))", "ls 2>&1 | grep x", "cat a >/dev/null 2>&1",
               "git status && git diff", "sed -n 1p f", "echo 'a > b'", "[[ a > b ]] && echo",
               "(( i > 3 )) && echo", "cat <<EOF\nrm -rf /\nEOF", "grep -r foo . | head",
               "python3 -c 'print(1 >> 2)'", "tee /dev/null", "npm test"]
WRITES_PYTHON = ["open('f', 'w')", "open(p, m)", "open(p, mode=m)", "import os as o\no.remove('x')",
                 "from shutil import rmtree\nrmtree('d')",
                 "from pathlib import Path\nPath('a').write_text('x')",
                 "from pathlib import Path\np = Path('a')\np.rename('b')",
                 "import subprocess; subprocess.run(['ls'])", "df.to_csv('x.csv')",
                 "exec(\"open('f', 'w')\")", "__import__('os').remove('x')",
                 "with open('x', 'r+') as f: pass"]
READS_PYTHON = ["x = 5 >> 16", "value >> 16", "open('f')", "open(p, mode='rb')",
                "s = df.to_csv()", "'abc'.replace('a', 'b')", "print(open('f').read())",
                "def broken(:"]


@pytest.mark.parametrize("command", WRITES_SHELL)
def test_shell_writes_are_seen(command):
    assert shell_write(command)


@pytest.mark.parametrize("command", READS_SHELL)
def test_shell_reads_pass(command):
    assert shell_write(command) is None


@pytest.mark.parametrize("code", WRITES_PYTHON)
def test_python_writes_are_seen(code):
    assert python_write(code)


@pytest.mark.parametrize("code", READS_PYTHON)
def test_python_reads_pass(code):
    assert python_write(code) is None


def test_node_writes_are_seen():
    assert node_write("require('fs').writeFileSync('a', 'b')") == "writeFileSync()"
    assert node_write("console.log(1 >> 2)") is None
