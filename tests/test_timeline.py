"""The overlap timeline and DDP buckets against hand-computed schedules."""
from __future__ import annotations

import pytest

from gravac.cluster.timeline import Piece, buckets, schedule

F, B, OPT = 1.0, 2.0, 0.1
READY = [2.0, 1.5, 1.0, 0.5]          # offsets from backward's start; parameter 3 is ready first


def test_one_piece_after_backward_is_the_serial_sum():
    s = schedule(F, B, READY, OPT, [Piece(None, 0.5, [0.3, 0.2])])
    assert s.step_s == pytest.approx(F + B + 0.5 + 0.3 + 0.2 + OPT)     # 4.1
    assert s.backward_end_s == pytest.approx(3.5) and s.exposed_comm_s == pytest.approx(0.5)


def test_ddp_buckets_hide_communication_behind_backward():
    # bucket [3, 2] ready at F + 1.0 = 2.0: link 2.0-2.4; bucket [1, 0] ready at 3.0: link 3.0-3.4
    s = schedule(F, B, READY, OPT, [Piece([1, 0], 0.0, [0.4]), Piece([3, 2], 0.0, [0.4])])
    assert s.step_s == pytest.approx(3.4 + OPT)
    assert s.link_end_s == pytest.approx(3.4) and s.exposed_comm_s == pytest.approx(0.4)


def test_a_busy_link_queues_messages_first_come_first_served():
    # 1.5 s each: the first bucket occupies the link 2.0-3.5, the second waits until 3.5 -> 5.0
    s = schedule(F, B, READY, OPT, [Piece([3, 2], 0.0, [1.5]), Piece([1, 0], 0.0, [1.5])])
    assert s.step_s == pytest.approx(5.0 + OPT)
    assert s.exposed_comm_s == pytest.approx(2.0)


def test_compression_runs_on_the_compute_resource_and_delays_backward():
    # piece A (ready at offset 1.0) compresses 2.0-2.2 and pushes the rest of backward by 0.2;
    # piece B (ready at 2.0 + 0.2 shift) compresses 3.2-3.4; messages: A 2.2-2.6, B 3.4-3.8
    s = schedule(F, B, READY, OPT, [Piece([3, 2], 0.2, [0.4]), Piece([1, 0], 0.2, [0.4])])
    assert s.backward_end_s == pytest.approx(3.4)
    assert s.step_s == pytest.approx(3.8 + OPT)


def test_messages_of_one_piece_go_in_order():
    # gains gather (0.1) then the payload (0.5), both after the whole-model compression
    s = schedule(F, B, READY, 0.0, [Piece(None, 0.25, [0.1, 0.5])])
    assert s.link_end_s == pytest.approx(F + B + 0.25 + 0.6)


def test_no_pieces_is_compute_plus_optimizer():
    assert schedule(F, B, READY, OPT, []).step_s == pytest.approx(F + B + OPT)


def test_buckets_follow_backward_order_and_caps():
    mb = 2**20 // 4                              # float32 elements per MiB
    sizes = [mb // 2, 3 * mb, mb // 4, mb // 4, 2 * mb]
    order = [4, 3, 2, 1, 0]                      # backward: last parameter first
    # first bucket capped at 1 MiB: param 4 (2 MiB) alone (a parameter above the cap gets its own);
    # then 3 MiB cap: 3 + 2 (0.5 MiB), adding 1 (3 MiB) would exceed it; then 1 alone; then 0
    assert buckets(sizes, order, 4, cap_mb=3, first_cap_mb=1) == [[4], [3, 2], [1], [0]]
    assert buckets(sizes, order, 4, cap_mb=100, first_cap_mb=100) == [[4, 3, 2, 1, 0]]
    every = buckets(sizes, order, 4, cap_mb=3, first_cap_mb=1)
    assert sorted(i for b in every for i in b) == list(range(5))      # each parameter exactly once
