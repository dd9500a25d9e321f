"""Approval modes; plan mode read-only by the operating system, the classifiers only early."""

from __future__ import annotations

import os

import pytest

from agent.gates.code_writes import node_write, python_write
from agent.gates.shell_writes import shell_write
from agent.history.messages import ToolCall, ToolResult
from agent.models.scripted import call, reply
import agentkit
from conftest import needs_bwrap


pytestmark = pytest.mark.daemon(shared=True)
kit = agentkit.kit


WRITES_SHELL = ["echo hi > out.txt", "rm -rf build", "git commit -m x", "sed -i s/a/b/ f",
                "python3 -c \"open('f','w').write('x')\"", "find . -name '*.pyc' -delete",
                "env FOO=1 rm x", "cat <<EOF > f\nhello\nEOF", "ls\nrm x", "pip install -e .",
                "bash -c 'touch x'", "echo x | tee out", "echo $(rm x)", "timeout 5 mv a b",
                "python3 - <<'EOF'\nimport os\nos.remove('x')\nEOF", "npm install",
                # options with a value before the command, combined flags, a descriptor first
                "git -C sub commit -m x", "git -c user.name=x commit", "sudo -u bob rm x",
                "nice -n 5 rm x", "timeout -s KILL 5 mv a b", "bash -lc 'rm x'",
                "python3 -Ic \"open('f', 'w')\"", "node -pe \"require('fs').rmSync('x')\"",
                "2>/dev/null rm x", "cat a | 2>/dev/null tee b",
                # out of the scratch folder, or into it from the workspace
                "touch /tmp/../ws/x", "echo > /tmp/../x", "mv notes /tmp/"]
READS_SHELL = ["ls -la", "echo $((x >> 16))", "ls 2>&1 | grep x", "cat a >/dev/null 2>&1",
               "git status && git diff", "sed -n 1p f", "echo 'a > b'", "[[ a > b ]] && echo",
               "(( i > 3 )) && echo", "cat <<EOF\nrm -rf /\nEOF", "grep -r foo . | head",
               "python3 -c 'print(1 >> 2)'", "tee /dev/null", "npm test", "command -v rm",
               "git -C sub status", "python3 script.py -c 'rm x'",
               # the session's scratch folder is writable in plan mode too
               "pytest > /tmp/out.txt 2>&1", "rm -rf /tmp/build", "mkdir -p /tmp/a/b",
               "make | tee /tmp/log", "dd if=/dev/zero of=/tmp/z count=1"]
WRITES_PYTHON = ["open('f', 'w')", "open(p, m)", "open(p, mode=m)", "import os as o\no.remove('x')",
                 "from shutil import rmtree\nrmtree('d')",
                 "from pathlib import Path\nPath('a').write_text('x')",
                 "from pathlib import Path\np = Path('a')\np.rename('b')",
                 "import subprocess; subprocess.run(['ls'])", "df.to_csv('x.csv')",
                 "exec(\"open('f', 'w')\")", "__import__('os').remove('x')",
                 "with open('x', 'r+') as f: pass", "open('/tmp/../x', 'w')",
                 "import os; os.system('/tmp/run.sh')",
                 "import shutil; shutil.move('/tmp/a', 'b')"]
READS_PYTHON = ["x = 5 >> 16", "value >> 16", "open('f')", "open(p, mode='rb')",
                "s = df.to_csv()", "'abc'.replace('a', 'b')", "print(open('f').read())",
                "def broken(:", "open('/tmp/out.txt', 'w')", "df.to_csv('/tmp/x.csv')",
                "import os; os.remove('/tmp/x')", "plt.savefig('/tmp/p.png')"]


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


def results(model) -> list[str]:
    return [m.text for m in model.requests[-1].messages if isinstance(m, ToolResult)]


HIDDEN_REPL = "m = 'w' if True else 'r'\ngetattr(__builtins__, 'op' + 'en')('made-by-repl', m)"
HIDDEN_SHELL = "c=\"open('made-by-shell', 'w')\"; python3 -c \"$c\""


@needs_bwrap
async def test_plan_mode_the_os_refuses_what_the_classifiers_cannot_see(kit):
    # What the classifiers cannot see: a builtin reached by name, a program through a variable.
    assert python_write(HIDDEN_REPL) is None and shell_write(HIDDEN_SHELL) is None
    agent = await kit.open([
        reply("", call("repl", code=HIDDEN_REPL)),
        reply("", call("run_terminal", command=HIDDEN_SHELL)),
        reply("", call("repl", code="x = 70000\nx >> 16")),
        reply("", call("run_terminal", command="x=70000; echo $((x >> 16))")),
        reply("", call("repl", code="m = input_mode = 'w'\nopen('f', m)")),
        reply("", call("run_terminal", command="echo kept > /tmp/notes; cat /tmp/notes")),
        reply("planned"),
    ], mode="plan")
    assert (await agent.run_turn("plan it")).outcome == "completed"
    seen = results(agent.model)
    assert "Read-only file system" in seen[0]
    assert "Read-only file system" in seen[1]
    assert seen[2] == "1"  # arithmetic, not a redirect
    assert seen[3] == "1\n[exit code 0]"
    assert seen[4].startswith("Plan mode is read-only, and this would write (open(...) with a "
                              "mode only known at run time)")
    assert seen[5].startswith("kept\n[exit code 0]")  # the scratch folder is no workspace
    assert os.listdir(kit.workspace) == []


@needs_bwrap
async def test_ask_mode_asks_before_commands_not_before_reads(kit):
    asked = []
    answers = iter([False, "always"])

    async def approve(tool_call):
        asked.append(tool_call.name)
        return next(answers)

    agent = await kit.open([
        reply("", call("process_output", id="bg0")),
        # Nothing to ask about: these cannot run, and the model is told why.
        reply("", ToolCall("c1", "run_terminal", {}, error="the arguments are not JSON"),
              call("make_coffee")),
        reply("", call("run_terminal", command="touch declined")),
        reply("", call("run_terminal", command="touch approved")),
        reply("", call("run_terminal", command="touch again")),
        reply("done"),
    ], mode="ask", approve=approve)
    assert (await agent.run_turn("go")).outcome == "completed"
    assert asked == ["run_terminal", "run_terminal"]  # not for the read, not after "always"
    assert sorted(os.listdir(kit.workspace)) == ["again", "approved"]
    seen = results(agent.model)
    assert seen[1:3] == ["Your call of 'run_terminal' could not be read: the arguments are not "
                         "JSON", seen[2]] and seen[2].startswith("There is no tool 'make_coffee'")
    assert seen[3].startswith("The user declined this call.")
    approvals = [e for e in agent.conversation.events() if e["type"] == "approval"]
    assert [(e["allowed"], e["asked"]) for e in approvals] == [(False, True), (True, True)]
