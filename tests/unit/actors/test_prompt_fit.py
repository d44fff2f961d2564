import pytest

from rredcot.actors.prompt_fit import NoPromptFits, PromptFit


def test_every_distinct_prompt_too_long_raises_with_the_count_and_the_shortest():
    watch = PromptFit(pool=3, max_model_len=256)
    watch.too_long("a", 300)
    watch.too_long("a", 300)  # the same problem in a later epoch counts once
    watch.too_long("b", 280)
    with pytest.raises(NoPromptFits, match=r"all 3 were rejected .*shortest has 270 tokens.* = 256\)"):
        watch.too_long("c", 270)


def test_one_prompt_that_fits_means_the_run_can_train():
    watch = PromptFit(pool=2, max_model_len=256)
    watch.too_long("a", 300)
    watch.fits()
    watch.too_long("b", 300)  # no error: "a" and "b" are too long, but some prompt fitted
    watch.too_long("a", 300)
