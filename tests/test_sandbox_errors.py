"""The sandbox layer raises its own errors; the server answers them with the contract's codes
through one table (toolsd/tools/wire_errors.py), the message unchanged."""

from __future__ import annotations

import pathlib
import re

from toolsd.sandbox.launch import file_helper_client
from toolsd.sandbox.errors import Fault, SandboxError
from toolsd.tools.wire_errors import as_wire
from toolsd.wire import errors as wire_errors

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_fault_answers_with_a_code_of_the_contract():
    codes = {v for k, v in vars(wire_errors).items() if k.isupper() and isinstance(v, str)}
    for fault in Fault:
        error = as_wire(SandboxError(fault, f"what to do about {fault.name}"))
        assert error.code in codes
        assert error.message == f"what to do about {fault.name}"
    assert as_wire(SandboxError(Fault.REFUSED, "x")).code == "bad_params"
    assert as_wire(SandboxError(Fault.CLOSED, "x")).code == "session_closed"
    assert as_wire(SandboxError(Fault.LIMIT, "x")).code == "limit_exceeded"


def test_every_code_the_file_helper_replies_with_has_its_fault():
    # The helper (run in the sandbox, standard library only) names its errors itself.
    said = set()
    for path in (ROOT / "driver").glob("*.py"):
        said |= set(re.findall(r'FileError\(\s*"([a-z_]+)"', path.read_text()))
        said |= set(re.findall(r'"code": "([a-z_]+)"', path.read_text()))
    assert said, "the scan found none of the helper's error codes"
    assert said <= set(file_helper_client._FAULTS), said - set(file_helper_client._FAULTS)
    # ...and each keeps the code it had on the wire before the sandbox had its own errors.
    for code, fault in file_helper_client._FAULTS.items():
        assert as_wire(SandboxError(fault, "x")).code == code
