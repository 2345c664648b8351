"""The control-plane protocol between ranks (and the CLI) and the coordinator, carried by the job's TCPStore.

Transport: the coordinator hosts a ``torch.distributed.TCPStore`` (``is_master``); its address is in
``RUN_DIR/coordinator.json`` ``{"host", "port", "pid", "secret_file", "protocol"}``. The store already has to
exist for ``torch.distributed`` rendezvous (ranks use ``PrefixStore(f"gen{g}", store)``), so the control
messages reuse it under the ``ctl/`` prefix instead of opening a second server:

- ``ctl/in``                 queue, everyone -> coordinator (all requests and reports);
- ``ctl/out/{world_rank}``   queue, coordinator -> one slot (instructions: inject, recover, stop, ...); the
                             slot reads it when the coordinator rang its doorbell on the liveness
                             connection (:mod:`phoenix_hpc.control.liveness`), not by polling;
- ``ctl/reply/{nonce}``      queue, coordinator -> the sender of one request that asked for a reply;
- ``ctl/beat``               counter the coordinator increments every heartbeat interval (ranks watch it
                             advance: a coordinator that died *or* hangs stops advancing it).

Every message is one JSON object ``{"v": 3, "body": {...}, "mac": hex}`` where ``mac`` is
HMAC-SHA256(secret, canonical JSON of body) and the secret is the per-job key in ``RUN_DIR/secret``
(mode 0600, readable only by the job's user). The secret itself never travels. The coordinator rejects a
message that is not JSON, lacks a MAC or whose MAC does not verify, or that speaks another protocol version
(:data:`PROTOCOL_VERSION`; ranks also compare the ``protocol`` of ``coordinator.json`` before they register),
and journals the rejection with a reason;
ranks verify the coordinator's messages the same way.

Replay protection: :func:`encode` puts ``sent_at`` (unix time, seconds) and ``nonce`` (96 random bits, hex)
into every body, so both are covered by the MAC. A :class:`ReplayGuard` at the receiver refuses a body whose
nonce it has already seen, and (where messages cannot wait long: the coordinator's inbox and operator
channel) one sent more than :data:`MAX_MESSAGE_AGE_S` before or after its own clock; a nonce is remembered
as long as a message carrying it could still pass the age check. A captured signed message (an inject, a
stop) sent again is therefore rejected, and the coordinator journals the rejection. Replies on the operator
channel carry ``in_reply_to`` = the request's nonce, so an old reply cannot answer a new request.

Request bodies (``type`` field) sent to ``ctl/in``:

==============  ==========================================================================================
register        world_rank, pid, node, role ("active"|"standby"), logical_rank (active), world_size,
                reply_to
heartbeat       world_rank, pid, generation, step
heartbeats      world_rank, pid (the carrier), beats [[world_rank, pid, generation, step, age_s, commit]]:
                one node's heartbeats and commit reports (commit: null or {g, live_step, shards,
                replicas}; control/node_beats.py)
commit          world_rank, generation, step, shards {shard_id: committed local step},
                replicas {shard_id: committed replica step} [, params [[step, digest: 16 hex digits], ...]:
                the digests of the snapshot's parameters of the newest commits, compared with the DP
                peers' (control/agreement.py)]
fault           world_rank, generation, step, phase, exc_type, message [, kind] [, signalled: the signal the
                slot received before (a stop is under way: the fault is journalled superseded)]
                [, corrupt_step, agreed_step, params: a commit fence showed DP replicas that differ
                (kind silent_corruption): the first step that differed, the newest agreed one, the
                slot's digests as in ``commit``]
done            world_rank, generation, step, state_hash [, commit: the newest commit report a node board
                holds, as a heartbeat entry carries it]
recovered       world_rank, generation, report (MemberReport JSON), timings {phase: seconds}
inject          kind, target {world_rank | logical_rank | node | coord [pp, dp, tp]}, at_step, phase,
                [steps_ahead: at_step is a lower bound, the fault lands at max(at_step, the step the
                target is in + steps_ahead); the reply's at_step says which], [confirm_within_s],
                reply_to; answered once the targets armed or refused it (control/injects.py)
inject_ack      world_rank, request_id, armed, at_step (armed at), started_step, reason (refused: why)
inject_fired    world_rank, request_id, step, phase (sent just before the effect)
drain           target {world_rank | logical_rank | node | coord}, [steps_ahead], [confirm_within_s],
                reply_to; answered once every active slot armed it (control/drains.py)
drain_ack       world_rank, request_id, attempt, armed, late (refused only as too late), at_step,
                started_step, reason
drain_reached   world_rank, request_id, step (live step: paused at the commit fence)
stop            reason [, reply_to]
==============  ==========================================================================================

Every body also carries ``sent_at`` and ``nonce`` (added by :func:`encode`). Instructions to a slot:
``quiesce``, ``recover``, ``resume``, ``inject`` {kind, at_step, phase, request_id [, steps_ahead]},
``disarm`` {request_id}, ``drain`` {request_id, at_step, attempt}, ``undrain`` {request_id}, ``stop``
{reason [, job_state]} (job_state: the job's end state, or what ends this slot: "drained" for a drained
slot, with drained: true; "fenced" for a slot declared dead, sent when it is declared dead and again for
any message it sends after; a planned end's first stop has checkpoint and generation instead,
control/planned_end.py). ``quiesce`` and ``recover`` are one signed message pushed to every member
(each slot's replay guard is its own). ``recover`` {generation, plan_key, plan_sha256} names the plan,
stored once signed under ``ctl/plan/{generation}`` (it lists every member, so a copy per member would make
a recovery O(members^2) bytes); the client reads and checks it (:func:`resolve_plan`) before handing the
instruction, with ``plan`` filled in, to the rank.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import secrets
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from phoenix_hpc.files import write_private_file
from phoenix_hpc.errors import ControlError
from phoenix_hpc.files import read_text

PROTOCOL_VERSION = 3
"""Version 3: the slots of a node send their heartbeats and commit reports together (``heartbeats``,
:mod:`phoenix_hpc.control.node_beats`), which a version-2 coordinator rejects as an unknown type.
Version 2: the coordinator rings a slot's doorbell on its liveness connection when it queues an instruction
(:mod:`phoenix_hpc.control.liveness`), and slots read their queue only then; a version-1 slot would never be
rung and a version-2 slot would wait for rings a version-1 coordinator never sends."""
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
INJECT_KINDS = ("node_loss", "crash", "hang", "transient", "link_down", "gpu_error", "exception", "nan",
                "corrupt_replica", "bitflip")
INJECT_PHASES = ("forward_backward", "reduce_gradients", "d2h", "h2h", "wait_commit", "optimizer_step", "recovery",
                 "restore")


class ProtocolError(ValueError):
    """A message could not be decoded or authenticated. ``str()`` is the reason journalled; ``key``: what
    makes two rejections the same one (a receiver journals each distinct rejection once)."""

    def __init__(self, reason: str, key: tuple | None = None):
        super().__init__(reason)
        self.key = key if key is not None else (reason[:40],)


MAX_MESSAGE_AGE_S = 120.0
"""How far a message's ``sent_at`` may lie from the receiver's clock (either way) at the coordinator. Its
inbox is drained continuously, so a genuine message is seconds old at most; the rest is room for the clock
differences of NTP-synchronised nodes."""


def stamp(body: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """``body`` with ``sent_at`` (``time.time()`` or ``now``) and a fresh ``nonce`` added (kept if present)."""
    out = dict(body)
    out.setdefault("sent_at", time.time() if now is None else float(now))
    out.setdefault("nonce", secrets.token_hex(12))
    return out


class ReplayGuard:
    """Refuses replayed and stale message bodies (see the module docstring).

    Args:
        max_age_s: the most ``|now - sent_at|`` may be; None: no age check (ranks: an instruction can wait in
            the queue for a whole long step), then every nonce is remembered for the life of the guard.
        clock: unix time in seconds (injectable for tests).
    """

    def __init__(self, max_age_s: float | None = MAX_MESSAGE_AGE_S, clock: Callable[[], float] = time.time):
        self.max_age_s = max_age_s
        self.clock = clock
        self._seen: dict[str, float] = {}  # nonce -> sent_at
        self._order: deque[tuple[float, str]] = deque()  # (time received, nonce), oldest first

    def check(self, body: dict[str, Any]) -> None:
        """Accept ``body`` once (records its nonce).

        Raises:
            ProtocolError: no ``sent_at``/``nonce``, ``sent_at`` too far from now, or the nonce was seen before.
        """
        sent, nonce = body.get("sent_at"), body.get("nonce")
        if isinstance(sent, bool) or not isinstance(sent, (int, float)) or not isinstance(nonce, str) or not nonce:
            raise ProtocolError(f"{body.get('type')} message without sent_at and nonce (replay protection); "
                                "sent by an older or foreign sender", key=("unstamped", body.get("type")))
        now = self.clock()
        if self.max_age_s is not None:
            self._forget(now)
            age = now - float(sent)
            if not math.isfinite(age) or abs(age) > self.max_age_s:
                what = "stale" if age > 0 else "from the future"
                when = f"{age:.1f} s ago" if age > 0 else f"{-age:.1f} s in the future"
                raise ProtocolError(f"{what} {body.get('type')} message: sent {when}, outside the "
                                    f"+-{self.max_age_s:g} s a message may take (a replay, or clocks apart)",
                                    key=(what, body.get("type"), body.get("world_rank")))
        if nonce in self._seen:
            raise ProtocolError(f"replayed {body.get('type')} message: nonce {nonce[:24]} was already received",
                                key=("replayed", nonce))
        self._seen[nonce] = float(sent)
        self._order.append((now, nonce))

    def _forget(self, now: float) -> None:
        """Drop nonces no message could still carry past the age check."""
        while self._order and now - self._order[0][0] > 2 * self.max_age_s:
            _, n = self._order.popleft()
            self._seen.pop(n, None)


def new_secret(run_dir: str | os.PathLike) -> bytes:
    """Create ``RUN_DIR/secret`` (0600, 32 random bytes as hex) unless it exists; return its content."""
    p = Path(run_dir) / SECRET_FILE
    if not p.exists():
        write_private_file(p, secrets.token_hex(32))
    return read_secret(run_dir)


def read_secret(run_dir: str | os.PathLike) -> bytes:
    """The job's secret from ``RUN_DIR/secret``.

    Raises:
        ControlError: no secret file (the coordinator has not started yet), or it is a directory, unreadable,
            empty or not UTF-8 (:func:`phoenix_hpc.files.read_text`).
    """
    return read_text(Path(run_dir) / SECRET_FILE, "job secret", error=ControlError).strip().encode()


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def encode(body: dict[str, Any], secret: bytes, version: int = PROTOCOL_VERSION) -> bytes:
    """Sign and serialise one message body, :func:`stamp`-ed with ``sent_at`` and ``nonce`` first.
    ``version``: the protocol version written (another one only to simulate an older or newer sender)."""
    body = stamp(body)
    mac = hmac.new(secret, _canonical(body), hashlib.sha256).hexdigest()
    return json.dumps({"v": version, "body": body, "mac": mac}, separators=(",", ":")).encode()


def decode(raw: bytes, secret: bytes) -> dict[str, Any]:
    """Parse and authenticate a message; return its body.

    The MAC is checked before the version (it covers the body only): a message of this job's secret in
    another protocol version is a member from another phoenix_hpc install, and the reason says so, naming
    its type and world rank.

    Raises:
        ProtocolError: not JSON, wrong shape, missing MAC, MAC mismatch, other version, or no ``type``.
    """
    try:
        msg = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ProtocolError(f"malformed message (not JSON): {raw[:60]!r}") from None
    if not isinstance(msg, dict) or not isinstance(msg.get("body"), dict):
        raise ProtocolError("malformed message (no body object)")
    mac = msg.get("mac")
    if not isinstance(mac, str) or not mac:
        raise ProtocolError("message without the job secret's MAC (not a member of this job)")
    want = hmac.new(secret, _canonical(msg["body"]), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, want):
        raise ProtocolError("message MAC does not verify with the job secret (foreign or tampered message)")
    v = msg.get("v")
    if v != PROTOCOL_VERSION:
        b = msg["body"]
        raise ProtocolError(
            f"{b.get('type')!r} message from world rank {b.get('world_rank')!r} speaks control protocol version "
            f"{v!r}, the receiver speaks {PROTOCOL_VERSION} (rank and coordinator from different phoenix_hpc "
            "installs); ignored", key=("version", v, b.get("world_rank")))
    if not isinstance(msg["body"].get("type"), str):
        raise ProtocolError("message body has no 'type'")
    return msg["body"]


def plan_key(generation: int) -> str:
    """The store key holding the signed recovery plan of ``generation``."""
    return f"ctl/plan/{int(generation)}"


def plan_digest(plan: dict[str, Any]) -> str:
    """SHA-256 (hex) of a plan's canonical JSON: what a ``recover`` instruction binds its plan by."""
    return hashlib.sha256(_canonical(plan)).hexdigest()


def plan_reference(store, generation: int, plan: dict[str, Any], secret: bytes) -> dict[str, Any]:
    """Store ``plan`` signed under :func:`plan_key` (one ``set``) and return the body of the ``recover``
    instruction that names it: ``{"type": "recover", "generation", "plan_key", "plan_sha256"}``."""
    store.set(plan_key(generation), encode({"type": "plan", "generation": int(generation), "plan": plan}, secret))
    return {"type": "recover", "generation": int(generation), "plan_key": plan_key(generation),
            "plan_sha256": plan_digest(plan)}


def resolve_plan(msg: dict[str, Any], fetch: Callable[[str], bytes], secret: bytes) -> dict[str, Any]:
    """A ``recover`` instruction with its plan: ``msg`` itself when it carries ``plan``, else ``msg`` with
    the plan read by ``fetch(plan_key)`` (a store ``get``), authenticated and checked against
    ``plan_sha256`` and ``generation``.

    Raises:
        ProtocolError: the stored plan is missing its MAC or does not verify, or its digest or generation
            differ from the instruction's.
    """
    if "plan" in msg or not msg.get("plan_key"):
        return msg
    body = decode(fetch(str(msg["plan_key"])), secret)
    plan = body.get("plan")
    if body.get("type") != "plan" or not isinstance(plan, dict) or plan_digest(plan) != msg.get("plan_sha256") \
            or body.get("generation") != msg.get("generation"):
        raise ProtocolError(f"recovery plan under {msg['plan_key']} does not match its recover instruction "
                            "(digest or generation)")
    return {**msg, "plan": plan}


def read_coordinator_file(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    """``RUN_DIR/coordinator.json`` as a dict, or None if it does not exist (yet).

    Raises:
        ControlError: it is a directory, unreadable, empty, not UTF-8, or not a JSON object.
    """
    p = Path(run_dir) / COORDINATOR_FILE
    text = read_text(p, "run directory", error=ControlError, missing_ok=True)
    if text is None:
        return None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ControlError(f"run directory file {str(p)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ControlError(f"run directory file {str(p)!r} must hold a JSON object")
    return data


def wait_for_coordinator(run_dir: str | os.PathLike, timeout_s: float, poll_s: float = 0.1) -> dict[str, Any]:
    """Wait until ``RUN_DIR/coordinator.json`` exists; return it.

    Raises:
        ControlError: not there after ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        info = read_coordinator_file(run_dir)
        if info is not None:
            return info
        if time.monotonic() > deadline:
            raise ControlError(f"no coordinator in {run_dir} after {timeout_s:g}s ({COORDINATOR_FILE} missing)")
        time.sleep(poll_s)
