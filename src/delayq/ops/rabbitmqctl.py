"""Running RabbitMQ's CLI tools (``rabbitmqctl``, ``rabbitmq-queues``) from delayq.

The command is a prefix the user chooses: ``rabbitmqctl``, a path, or
``kubectl exec rabbitmq-0 -- rabbitmqctl``; the tool, ``-n node``, the Erlang
cookie in ``$HOME`` (or ``--erlang-cookie``) decide which node answers.
Every failure is a delayq error saying what ran and what it printed.
"""

from __future__ import annotations

import shlex
import subprocess
from collections.abc import Mapping, Sequence

from delayq.errors import BrokerError, InvalidInput

__all__ = ["erlang_binary", "erlang_node", "run_ctl"]


def run_ctl(
    command: Sequence[str],
    args: Sequence[str],
    *,
    what: str,
    timeout_s: float = 60.0,
    env: Mapping[str, str] | None = None,
    hint: str = "pass the command with its path",
) -> str:
    """Run ``command + args``; return its standard output.

    :raises InvalidInput: the command is not found (``hint`` says what to do).
    :raises BrokerError: it failed, or did not end within ``timeout_s``.
    """
    line = [*command, *args]
    if not line:
        raise InvalidInput(f"no command given to {what}")
    try:
        result = subprocess.run(
            line,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            env=None if env is None else dict(env),
        )
    except FileNotFoundError:
        raise InvalidInput(
            f"{line[0]!r} was not found: install RabbitMQ's CLI tools, or {hint}"
        ) from None
    except subprocess.TimeoutExpired:
        raise BrokerError(
            f"{what}: {shlex.join(line[:1])} did not answer within {timeout_s:g} s"
        ) from None
    if result.returncode != 0:
        output = (result.stderr.strip() or result.stdout.strip()).splitlines()
        raise BrokerError(f"{what} failed ({result.returncode}): {' '.join(output[-3:])}")
    return result.stdout


def erlang_binary(text: str) -> str:
    """``text`` as an Erlang binary literal of its UTF-8 bytes: nothing in it is parsed."""
    return "<<" + ",".join(str(b) for b in text.encode()) + ">>"


def erlang_node(name: str) -> str:
    """A node name as an Erlang expression giving the atom, built from its bytes."""
    return f"binary_to_atom({erlang_binary(name)}, utf8)"
