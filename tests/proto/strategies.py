"""Hypothesis strategies for every typed message, per protocol version (what each version can express)."""

from __future__ import annotations

from hypothesis import strategies as st

from quorumlog.proto import messages as m
from quorumlog.proto.status import StatusCode

i64 = st.integers(-(2**63), 2**63 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
key20 = st.binary(min_size=20, max_size=20)
blob = st.binary(max_size=200)
# What we send to a 4.14 peer: everything but the 4.15+ EUNKNOWNLEDGERSTATE (which goes out as EIO).
status = st.sampled_from([s for s in StatusCode if s is not StatusCode.EUNKNOWNLEDGERSTATE])
v2_priority = st.sampled_from([0, m.HIGH_PRIORITY])


@st.composite
def entry_body(draw: st.DrawFn, ledger_id: int, entry_id: int) -> bytes:
    # The bookie does not know the digest type: any bytes after the ids are an opaque entry to the codec.
    return (
        ledger_id.to_bytes(8, "big", signed=True)
        + entry_id.to_bytes(8, "big", signed=True)
        + draw(st.binary(min_size=16, max_size=300))
    )


@st.composite
def v2_add_request(draw: st.DrawFn) -> m.AddRequest:
    ledger, entry = draw(i64), draw(i64)
    return m.AddRequest(
        ledger,
        entry,
        draw(key20),
        draw(entry_body(ledger, entry)),
        recovery=draw(st.booleans()),
        priority=draw(v2_priority),
    )


@st.composite
def v2_read_request(draw: st.DrawFn) -> m.ReadRequest:
    fence = draw(st.booleans())
    return m.ReadRequest(
        draw(i64),
        draw(i64),
        fence=fence,
        master_key=draw(key20) if fence else None,
        priority=draw(v2_priority),
    )


v2_auth_request = st.builds(m.AuthRequest, st.text(max_size=30), blob, priority=v2_priority)

V2_REQUESTS = {
    m.AddRequest: v2_add_request(),
    m.ReadRequest: v2_read_request(),
    m.AuthRequest: v2_auth_request,
}
V2_RESPONSES = {
    m.AddResponse: st.builds(m.AddResponse, status, i64, i64),
    m.ReadResponse: st.builds(
        m.ReadResponse, status, i64, i64, st.none() | st.binary(min_size=1, max_size=300)
    ),
    m.AuthResponse: st.builds(m.AuthResponse, st.just(StatusCode.EOK), st.text(max_size=30), blob),
}

opt_i64 = st.none() | i64


@st.composite
def v3_read_request(draw: st.DrawFn) -> m.ReadRequest:
    flag = draw(st.sampled_from(["none", "fence", "piggyback"]))
    return m.ReadRequest(
        draw(i64),
        draw(i64),
        fence=flag == "fence",
        master_key=draw(st.none() | blob),
        piggyback=flag == "piggyback",
        previous_lac=draw(opt_i64),
        timeout_ms=draw(opt_i64),
        priority=draw(u32),
        txn_id=draw(u64),
    )


V3_REQUESTS = {
    m.AddRequest: st.builds(m.AddRequest, i64, i64, blob, blob, st.booleans(), i32, priority=u32, txn_id=u64),
    m.ReadRequest: v3_read_request(),
    m.ReadLacRequest: st.builds(m.ReadLacRequest, i64, priority=u32, txn_id=u64),
    m.WriteLacRequest: st.builds(m.WriteLacRequest, i64, i64, blob, blob, priority=u32, txn_id=u64),
    m.GetBookieInfoRequest: st.builds(m.GetBookieInfoRequest, opt_i64, priority=u32, txn_id=u64),
    m.ForceLedgerRequest: st.builds(m.ForceLedgerRequest, i64, priority=u32, txn_id=u64),
    m.GetListOfEntriesOfLedgerRequest: st.builds(
        m.GetListOfEntriesOfLedgerRequest, i64, priority=u32, txn_id=u64
    ),
    m.StartTLSRequest: st.builds(m.StartTLSRequest, priority=u32, txn_id=u64),
    m.AuthRequest: st.builds(m.AuthRequest, st.text(max_size=30), blob, priority=u32, txn_id=u64),
}
V3_RESPONSES = {
    m.AddResponse: st.builds(m.AddResponse, status, i64, i64, txn_id=u64),
    m.ReadResponse: st.builds(
        m.ReadResponse, status, i64, i64, st.none() | blob, opt_i64, opt_i64, txn_id=u64
    ),
    m.ReadLacResponse: st.builds(
        m.ReadLacResponse, status, i64, st.none() | blob, st.none() | blob, txn_id=u64
    ),
    m.WriteLacResponse: st.builds(m.WriteLacResponse, status, i64, txn_id=u64),
    m.GetBookieInfoResponse: st.builds(m.GetBookieInfoResponse, status, opt_i64, opt_i64, txn_id=u64),
    m.ForceLedgerResponse: st.builds(m.ForceLedgerResponse, status, i64, txn_id=u64),
    m.GetListOfEntriesOfLedgerResponse: st.builds(
        m.GetListOfEntriesOfLedgerResponse, status, i64, st.none() | blob, txn_id=u64
    ),
    m.StartTLSResponse: st.builds(m.StartTLSResponse, status, txn_id=u64),
    m.AuthResponse: st.builds(m.AuthResponse, status, st.text(max_size=30), blob, txn_id=u64),
    m.ErrorResponse: st.builds(m.ErrorResponse, st.sampled_from(list(m.OpCode)), status, txn_id=u64),
}
