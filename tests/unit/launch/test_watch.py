from rredcot.launch.watch import next_eval_step


def test_the_next_periodic_evaluation_is_the_next_multiple():
    assert next_eval_step(50, 50) == 100 and next_eval_step(51, 50) == 100
    assert next_eval_step(600, 50) == 650  # resumed at 600: one evaluation, not twelve in a row
