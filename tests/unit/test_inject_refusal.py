"""The coordinator refuses an injection for a step its target already did (control/inject_relay.py): a
``rejected`` reply naming the step and the target's, nothing forwarded to any slot, nothing journalled as
forwarded. (End to end, ``phoenix inject-fault`` may refuse the same request itself first, from the job's
progress in the journal: tests/e2e/test_inject_status.py.)"""

from test_drain import _coordinator, _events, _sent

from phoenix_hpc.control import protocol as P


def test_a_step_the_target_already_did_is_refused_and_nothing_is_forwarded(tmp_path):
    c = _coordinator(tmp_path)
    c.slots[1].step = 9
    since = len(c.store.pushed)
    c._dispatch({"type": "inject", "kind": "crash", "phase": "forward_backward", "at_step": 4,
                 "target": {"logical_rank": 1}, "reply_to": "cli-1", "nonce": "n1"})
    replies = [P.decode(raw, c.secret) for k, raw in c.store.pushed[since:] if k == P.key_reply("cli-1")]
    assert [(m["type"], m["reason"], m["in_reply_to"]) for m in replies] == [
        ("rejected", "inject: step 4 already done by the target (at step 9)", "n1")]
    assert _sent(c, since) == [] and _events(tmp_path, "inject_forwarded") == [] and c.injects.requests == {}
    # the same request for a later step is forwarded to the target
    c._dispatch({"type": "inject", "kind": "crash", "phase": "forward_backward", "at_step": 10,
                 "target": {"logical_rank": 1}, "reply_to": "cli-1", "nonce": "n2"})
    assert [(w, m["type"], m["at_step"]) for w, m in _sent(c, since)] == [(1, "inject", 10)]
