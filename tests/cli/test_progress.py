"""The run progress bar: its rate ignores Ray's start-up, and rounds that are not
evaluated show the latest evaluated accuracy (never `nan`)."""

import math

from raydpfl.cli.progress import Progress


def _row(round_idx, acc=math.nan, seconds=2.0, eps=1.5):
    return {"round": round_idx, "test_accuracy": acc, "epsilon_max": eps, "wall_seconds": seconds}


def test_round_one_does_not_count_the_start_up_time(capsys):
    progress = Progress(total=10, enabled=True)
    bar = progress.bar
    bar.start_t -= 100.0  # Ray and the workers took 100 s to start
    bar.last_print_t = bar.start_t

    progress.update(_row(1, acc=0.5, seconds=2.0))

    assert 0.3 < bar.format_dict["rate"] < 0.7  # ~1 round per 2 s, not 1 per 102 s
    assert bar.format_dict["elapsed"] < 10
    progress.close()


def test_rounds_without_evaluation_show_the_last_accuracy(capsys):
    progress = Progress(total=10, enabled=True)

    progress.update(_row(1))  # eval_every > 1: round 1 not evaluated
    assert "acc" not in progress.postfix(_row(1))
    progress.update(_row(2, acc=0.75))
    progress.update(_row(3))

    assert progress.postfix(_row(3)) == {"acc": "0.7500", "eps": "1.500"}
    progress.close()
    assert "nan" not in capsys.readouterr().err


def test_a_resumed_bar_starts_at_the_checkpoint_round(capsys):
    progress = Progress(total=10, enabled=True, start=6)

    progress.update(_row(7, acc=0.5))

    assert progress.bar.n == 7
    progress.close()
