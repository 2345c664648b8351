"""The control-plane protocol between ranks (and the CLI) and the coordinator, carried by the job's TCPStore.

Transport: the coordinator hosts a ``torch.distributed.TCPStore`` (``is_master``); its address is in
``RUN_DIR/coordinator.json`` ``{"host", "port", "pid", "secret_file", "protocol"}``. The store already has to
exist for ``torch.distributed`` rendezvous (ranks use ``PrefixStore(f"gen{g}", store)``), so the control
messages reuse it under the ``ctl/`` prefix instead of opening a second server:

- ``ctl/in``                 queue, everyone -> coordinator (all requests and reports);
- ``ctl/out/{world_rank}``   queue, coordinator -> one slot (instructions: inject, recover, stop, ...);
- ``ctl/reply/{nonce}``      queue, coordinator -> the sender of one request that asked for a reply;
- ``ctl/beat``               counter the coordinator increments every heartbeat interval (ranks watch it
                             advance: a coordinator that died *or* hangs stops advancing it).

Every message is one JSON object ``{"v": 1, "body": {...}, "mac": hex}`` where ``mac`` is
HMAC-SHA256(secret, canonical JSON of body) and the secret is the per-job key in ``RUN_DIR/secret``
(mode 0600, readable only by the job's user). The secret itself never travels. The coordinator rejects a
message that is not JSON, lacks a MAC or whose MAC does not verify, and journals the rejection with a reason;
ranks verify the coordinator's messages the same way.

Request bodies (``type`` field) sent to ``ctl/in``:

==============  ==========================================================================================
register        world_rank, pid, node, role ("active"|"standby"), logical_rank (active), world_size,
                reply_to
heartbeat       world_rank, pid, generation, step
commit          world_rank, generation, step, shards {shard_id: committed local step},
                replicas {shard_id: committed replica step}
fault           world_rank, generation, step, phase, exc_type, message [, kind]
done            world_rank, generation, step, state_hash
recovered       world_rank, generation, report (MemberReport JSON), timings {phase: seconds}
inject          kind, target {world_rank | logical_rank | node | coord [pp, dp, tp]}, at_step, phase,
                [steps_ahead: at_step is a lower bound, the fault lands at max(at_step, the target's
                live step + steps_ahead); the reply's at_step says which], reply_to
stop            reason [, reply_to]
==============  ==========================================================================================
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from pathlib import Path
from typing import Any

from phoenix_hpc.control.journal import write_private_file

PROTOCOL_VERSION = 1
COORDINATOR_FILE = "coordinator.json"
SECRET_FILE = "secret"
EXIT_STATUS_FILE = "job_exit_status"  # the coordinator's verdict (0 done, 1 failed, 3 stopped), for the batch script

KEY_IN = "ctl/in"
KEY_BEAT = "ctl/beat"


def key_out(world_rank: int) -> str:
    """The instruction queue of one slot."""
    return f"ctl/out/{int(world_rank)}"


def key_reply(nonce: str) -> str:
    """The reply queue of one request."""
    return f"ctl/reply/{nonce}"


# Fault injection (for ``phoenix inject-fault`` and step-targeted tests): what can be injected and where.
INJECT_KINDS = ("node_loss", "crash", "hang", "transient", "link_down", "gpu_error", "exception", "nan")
INJECT_PHASES = ("forward_backward", "reduce_gradients", "d2h", "h2h", "wait_commit", "optimizer_step", "recovery")


class ProtocolError(ValueError):
    """A message could not be decoded or authenticated. ``str()`` is the reason journalled."""


def new_secret(run_dir: str | os.PathLike) -> bytes:
    """Create ``RUN_DIR/secret`` (0600, 32 random bytes as hex) unless it exists; return its content."""
    p = Path(run_dir) / SECRET_FILE
    if not p.exists():
        write_private_file(p, secrets.token_hex(32))
    return read_secret(run_dir)


def read_secret(run_dir: str | os.PathLike) -> bytes:
    """The job's secret from ``RUN_DIR/secret``.

    Raises:
        FileNotFoundError: no secret file (the coordinator has not started yet).
    """
    return (Path(run_dir) / SECRET_FILE).read_text().strip().encode()


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode(body: dict[str, Any], secret: bytes) -> bytes:
    """Sign and serialise one message body."""
    mac = hmac.new(secret, _canonical(body), hashlib.sha256).hexdigest()
    return json.dumps({"v": PROTOCOL_VERSION, "body": body, "mac": mac}, separators=(",", ":")).encode()


def decode(raw: bytes, secret: bytes) -> dict[str, Any]:
    """Parse and authenticate a message; return its body.

    Raises:
        ProtocolError: not JSON, wrong shape or version, missing MAC, MAC mismatch, or no ``type``.
    """
    try:
        msg = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProtocolError(f"malformed message (not JSON): {raw[:60]!r}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("body"), dict):
        raise ProtocolError("malformed message (no body object)")
    if msg.get("v") != PROTOCOL_VERSION:
        raise ProtocolError(f"unsupported protocol version {msg.get('v')!r}, expected {PROTOCOL_VERSION}")
    mac = msg.get("mac")
    if not isinstance(mac, str) or not mac:
        raise ProtocolError("message without the job secret's MAC (not a member of this job)")
    want = hmac.new(secret, _canonical(msg["body"]), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, want):
        raise ProtocolError("message MAC does not verify with the job secret (foreign or tampered message)")
    if not isinstance(msg["body"].get("type"), str):
        raise ProtocolError("message body has no 'type'")
    return msg["body"]


def read_coordinator_file(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``RUN_DIR/coordinator.json`` as a dict, or None if it does not exist (yet)."""
    p = Path(run_dir) / COORDINATOR_FILE
    try:
        return json.loads(p.read_text())
    except FileNotFoundError:
        return None
