"""The engines' seeded sampling (`rollout/sampling.py`): inverse-CDF draws follow the distribution, never pick an
index of probability 0, and a request's uniforms come from its own generator whatever its batch."""

import torch

from agentrl_ray.rollout.sampling import inverse_cdf, request_uniforms


def test_draws_follow_the_distribution_and_skip_zero_probabilities():
    probs = torch.tensor([0.05, 0.0, 0.4, 0.25, 0.0, 0.3])
    n = 200_000
    uniforms = torch.rand(n, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    picks = inverse_cdf(probs.expand(n, -1), uniforms)  # (n,)
    freq = torch.bincount(picks, minlength=6).double() / n
    assert freq[1] == 0 and freq[4] == 0
    assert (freq - probs.double()).abs().max() < 0.005  # ~5 standard errors at n = 200k


def test_unnormalised_weights_give_the_same_picks():
    probs = torch.softmax(torch.randn(4, 50, generator=torch.Generator().manual_seed(1)), -1)
    uniforms = torch.rand(4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    assert torch.equal(inverse_cdf(probs, uniforms), inverse_cdf(probs * 8.0, uniforms))  # a power of 2: exact


def test_a_uniform_that_rounds_up_to_one_picks_the_last_possible_index():
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0]])
    uniforms = torch.tensor([1.0 - 1e-12], dtype=torch.float64)  # 1.0 once cast to float32
    assert inverse_cdf(probs, uniforms).tolist() == [1]
    assert inverse_cdf(probs, torch.zeros(1, dtype=torch.float64)).tolist() == [0]


def test_a_requests_uniforms_come_from_its_own_generator():
    def seeded(seed):
        return torch.Generator().manual_seed(seed)

    gens = {0: seeded(5), 2: seeded(7)}
    first, second = request_uniforms(gens, 3), request_uniforms(gens, 3)
    for row, seed in ((0, 5), (2, 7)):
        assert [first[row].item(), second[row].item()] == torch.rand(
            2, generator=seeded(seed), dtype=torch.float64
        ).tolist()
    assert 0.0 <= first[1] < 1.0  # an unseeded request: the process's generator
    # Alone in its batch, a request draws what it drew beside others.
    assert request_uniforms({0: seeded(7)}, 1).tolist() == [
        torch.rand(1, generator=seeded(7), dtype=torch.float64).item()
    ]
