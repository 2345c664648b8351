"""Simulated ranks for the control-plane benchmark: many slots per process, speaking the real protocol.

One :func:`worker` process plays a block of slots against a real coordinator
(:mod:`phoenix_hpc.control.coordinator`). Per slot it does what :class:`~phoenix_hpc.control.client.
CoordinatorClient` does, with the same signed messages (:func:`phoenix_hpc.control.protocol.encode`) on the
same TCPStore keys and the same liveness connection (:func:`phoenix_hpc.control.liveness.connect_alive`):

- ``register`` (a request answered on ``ctl/reply/{nonce}``), then one liveness connection held open;
- per simulated node, every ``heartbeat_interval_s``: one ``heartbeats`` message for the node's slots (what
  the node's carrier sends, :mod:`phoenix_hpc.control.node_beats`), each active slot's entry carrying its
  commit report (own shard and the one replica it holds, k = 1; a new step every ``step_s``), and one read of
  ``ctl/beat``; nodes spread evenly over the interval. A slot is in its node's message from the moment its
  registration is answered, while the other slots still register (a node's heartbeats do not wait for the
  whole simulated block). A slot that "stops" (silence) or "exits" stays in the message with its record's
  age growing until the heartbeat timeout, as the record it left on its node's board would;
- while watching a recovery: its instruction queue ``ctl/out/{world_rank}`` is read when its doorbell rang
  on its liveness connection, as the real slot does (:mod:`phoenix_hpc.control.liveness`; no slot polls the
  store); ``quiesce`` is answered with ``quiesced`` (live step, committed and previous step of every copy),
  ``recover`` is timed.

What is not the real rank: no training, no board files (the process knows its nodes' slots), one TCPStore
connection per process instead of two per slot (the store server is C++ and serves each request alike; the
coordinator's Python loop sees the same messages), and the slots of one process share its clock and CPU.

The driver (:mod:`phoenix_hpc.bench.control_plane`) talks to a worker over a ``multiprocessing`` pipe:
commands ``("silence", w)``, ``("exit", w)``, ``("watch", None)``, ``("report", None)``, ``("stop", None)``;
every command is answered with one dict.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta
from typing import Any

from phoenix_hpc.control import protocol as P


def shard_of(logical: int) -> str:
    """Shard id of a logical rank on the benchmark's grid tp = pp = 1 (``opt/pp0/tp0/dp{r}``)."""
    return f"opt/pp0/tp0/dp{logical}"


def holder_of(logical: int, active: int, per_node: int) -> int:
    """The logical rank holding the replica of ``logical``'s shard: the same place on the next node."""
    return (logical + per_node) % active


def worker(conn, spec: dict[str, Any]) -> None:
    """Entry point of one simulator process (see the module docstring).

    ``spec``: host, port, liveness_port, secret (str), slots [{world_rank, node, role, logical_rank}] (whole
    nodes), active (number of active slots), per_node, interval_s, timeout_s, step_s, t0 (unix time the step
    clock starts), world_size.
    """
    import torch.distributed as dist
    from phoenix_hpc.control.liveness import connect_alive

    secret = spec["secret"].encode()
    store = dist.TCPStore(spec["host"], int(spec["port"]), is_master=False, wait_for_workers=False,
                          timeout=timedelta(seconds=60))
    slots = spec["slots"]
    by_rank = {s["world_rank"]: s for s in slots}
    active, per_node = int(spec["active"]), int(spec["per_node"])
    interval, step_s, t0 = float(spec["interval_s"]), float(spec["step_s"]), float(spec["t0"])
    timeout_s = float(spec.get("timeout_s", 10.0))
    pid_base = 100000 + slots[0]["world_rank"]
    nodes: dict[str, list[int]] = {}
    for s in slots:
        nodes.setdefault(s["node"], []).append(s["world_rank"])
    node_names = list(nodes)

    def pid(w: int) -> int:
        return pid_base + w

    # --- register: every request first; replies are taken in the main loop ---------------------------
    t_reg = time.time()
    pending: dict[str, int] = {}
    for s in slots:
        nonce = f"sim{s['world_rank']}x{int(t_reg * 1e6)}"
        body = {"type": "register", "world_rank": s["world_rank"], "pid": pid(s["world_rank"]), "node": s["node"],
                "role": s["role"], "logical_rank": s["logical_rank"],
                "grid": [1, 1, active] if s["role"] == "active" else None, "world_size": spec["world_size"],
                "reply_to": nonce}
        store.queue_push(P.KEY_IN, P.encode(body, secret))
        pending[nonce] = s["world_rank"]
    pending_order = list(pending)
    refused: list[str] = []
    reg_deadline = time.time() + 600
    reg_reported = False
    alive: dict[int, socket.socket] = {}
    sending: set[int] = set()  # registered slots whose records are fresh
    frozen: dict[int, float] = {}  # world rank -> unix time its record was last written (silent or exited)
    last_beat: dict[str, float] = {}  # node -> unix time of its newest heartbeats message
    watch = False
    received: dict[int, float] = {}  # world rank -> unix time its recover instruction was read
    plans: dict[tuple, dict] = {}  # (plan_key, plan_sha256) -> the resolved recover instruction
    answered = 0
    beats = entries = commits = 0
    order = [s["world_rank"] for s in slots]
    n = len(order)

    def step_now() -> int:
        return max(1, int((time.time() - t0) / step_s))

    def commit_of(w: int) -> dict[str, Any]:
        r = by_rank[w]["logical_rank"]
        st = step_now() - 1
        held = (r - per_node) % active
        return {"g": 0, "live_step": st, "shards": {shard_of(r): st}, "replicas": {shard_of(held): st}}

    def beat(node: str) -> None:
        nonlocal beats, entries, commits
        now = time.time()
        out = []
        for w in nodes[node]:
            if w in sending:
                age = 0.0
            elif w in frozen and now - frozen[w] <= timeout_s:
                age = round(now - frozen[w], 3)
            else:
                continue
            s = by_rank[w]
            act = s["role"] == "active"
            out.append([w, pid(w), 0 if act else None, step_now(), age, commit_of(w) if act and not age else None])
            commits += 1 if act and not age else 0
        if not out:
            return
        store.queue_push(P.KEY_IN, P.encode({"type": "heartbeats", "world_rank": out[0][0], "pid": out[0][1],
                                             "beats": out}, secret))
        store.add(P.KEY_BEAT, 0)
        last_beat[node] = now
        beats += 1
        entries += len(out)

    def take_replies(limit: int) -> None:
        nonlocal reg_reported
        done = 0
        for nonce in pending_order[:limit]:
            try:
                raw = store.queue_pop(P.key_reply(nonce), block=False)
            except dist.QueueEmptyError:
                break  # the coordinator answers one process's requests in the order they were sent
            done += 1
            w = pending.pop(nonce)
            reply = P.decode(raw, secret)
            if reply.get("type") != "registered":
                refused.append(f"{w}: {reply.get('reason')}")
                continue
            alive[w] = connect_alive(spec["host"], int(spec["liveness_port"]), w, pid(w), secret)
            alive[w].setblocking(False)
            bells.register(alive[w], selectors.EVENT_READ, w)
            sending.add(w)
        del pending_order[:done]
        if not reg_reported and (not pending or time.time() > reg_deadline):
            reg_reported = True
            conn.send({"registered": len(slots) - len(pending) - len(refused), "refused": refused[:5],
                       "missing": len(pending), "register_s": time.time() - t_reg})
        elif not done:
            time.sleep(0.005)

    def read_instructions(w: int) -> None:
        nonlocal answered
        s = by_rank[w]
        while True:
            try:
                raw = store.queue_pop(P.key_out(w), block=False)
            except dist.QueueEmptyError:
                return
            msg = P.decode(raw, secret)
            if msg["type"] == "quiesce" and w in sending and s["role"] == "active":
                r = s["logical_rank"]
                st = step_now() - 1
                held = (r - per_node) % active
                store.queue_push(P.KEY_IN, P.encode({
                    "type": "quiesced", "world_rank": w, "pid": pid(w), "generation": msg["generation"],
                    "live_step": st, "shards": {shard_of(r): [st, st - 1]},
                    "replicas": {shard_of(held): [st, st - 1]}, "dirty": False}, secret))
                answered += 1
            elif msg["type"] == "recover":
                # what a member's client does with the plan's key; a real member does it once on its own CPU,
                # so the simulator verifies each stored plan once per process, not once per simulated member
                ref = (msg.get("plan_key"), msg.get("plan_sha256"))
                if ref not in plans:
                    plans[ref] = P.resolve_plan(msg, store.get, secret)
                received.setdefault(w, time.time())

    import selectors

    bells = selectors.DefaultSelector()  # the doorbells of this process's slots (their liveness connections)
    hb = _Round(len(node_names), interval, time.time())
    while True:
        if not reg_reported:
            take_replies(256)
        elif conn.poll():
            cmd, arg = conn.recv()
            if cmd == "silence":
                was = arg in sending
                sending.discard(arg)
                t_last = last_beat.get(by_rank[arg]["node"])
                if was and t_last is not None:
                    frozen[arg] = t_last
                conn.send({"t_last_beat": t_last, "was_sending": was})
            elif cmd == "exit":
                if arg in sending:
                    sending.discard(arg)
                    frozen[arg] = last_beat.get(by_rank[arg]["node"], time.time())
                sock = alive.pop(arg, None)
                t = time.time()
                if sock is not None:
                    bells.unregister(sock)
                    sock.close()
                conn.send({"t_exit": t})
            elif cmd == "watch":
                watch = True
                conn.send({"ok": True})
            elif cmd == "report":
                conn.send({"beats": beats, "entries": entries, "commits": commits, "late_s": hb.late_s,
                           "received": dict(received), "answered": answered, "slots": n})
            elif cmd == "stop":
                for sock in alive.values():
                    sock.close()
                conn.send({"ok": True})
                return
        for i in hb.due(time.time(), 64):
            beat(node_names[i])
        wait = max(0.0, min(0.005, hb.next_at() - time.time())) if reg_reported else 0.0
        if watch:
            for key, _ in bells.select(timeout=wait):  # sleeps until a ring or the next node's heartbeat
                try:
                    key.fileobj.recv(4096)  # the rings: the queue holds something new
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    bells.unregister(key.fileobj)
                    continue
                read_instructions(key.data)
        elif reg_reported:
            time.sleep(wait)


class _Round:
    """``n`` slots each due once per ``period_s``, slot i at ``start + (m + i/n) * period_s``; remembers how
    late the newest finished round ended (``late_s``: the simulator could not keep the rate)."""

    def __init__(self, n: int, period_s: float, start: float):
        self.n, self.period_s, self.start, self.i, self.late_s = n, period_s, start, 0, 0.0

    def next_at(self) -> float:
        return self.start + self.period_s * self.i / self.n

    def due(self, now: float, limit: int) -> list[int]:
        out = []
        while len(out) < limit and now >= self.next_at():
            out.append(self.i)
            self.i += 1
            if self.i >= self.n:
                self.late_s = max(self.late_s, now - (self.start + self.period_s))
                self.start += self.period_s
                self.i = 0
        return out
