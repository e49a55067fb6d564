"""dsl/generic.py: which numbers of a program printed at sample sizes become dimension
expressions, and which stay numbers or make the print an error."""
from __future__ import annotations

import pytest

from dsl.generic import NotGeneric, dimension_expression, merge, sample_sizes

NAMES = ["B", "T", "W", "KW", "D"]
SAMPLES = sample_sizes(NAMES)


def at_samples(f) -> list[int]:
    return [f(**s) for s in SAMPLES]


def test_samples_are_distinct_primes_larger_for_earlier_names():
    sizes = [v for s in SAMPLES for v in s.values()]
    assert len(set(sizes)) == len(sizes) and min(sizes) >= 11
    assert all(all(p % q for q in range(2, p)) for p in sizes)
    assert all(list(s.values()) == sorted(s.values(), reverse=True) for s in SAMPLES)


@pytest.mark.parametrize("text, f", [
    ("B", lambda B, T, W, KW, D: B),
    ("B * T", lambda B, T, W, KW, D: B * T),
    ("3 * D", lambda B, T, W, KW, D: 3 * D),
    ("W - KW + 1", lambda B, T, W, KW, D: W - KW + 1),
    ("B * D * T", lambda B, T, W, KW, D: B * T * D),     # names in alphabetical order
    ("2 * B * T - 1", lambda B, T, W, KW, D: 2 * B * T - 1),
    ("B * T + D", lambda B, T, W, KW, D: B * T + D),
    ("-D + 4", lambda B, T, W, KW, D: 4 - D),
])
def test_a_number_that_follows_the_sizes_is_their_expression(text, f):
    assert dimension_expression(at_samples(f), SAMPLES) == text


@pytest.mark.parametrize("f", [
    lambda B, T, W, KW, D: D // 7,                    # a floor division
    lambda B, T, W, KW, D: B * T * W * KW,           # past the degree searched
    lambda B, T, W, KW, D: B + T + D,                # three terms
])
def test_a_number_that_follows_the_sizes_in_no_expression_has_none(f):
    assert dimension_expression(at_samples(f), SAMPLES) is None


def test_a_number_equal_to_a_size_in_one_sample_stays_a_number():
    b = SAMPLES[0]["B"]
    texts = [f"x: f32[{s['B']}, {b}]\n" for s in SAMPLES]
    assert merge(texts, SAMPLES) == "x: f32[B, " + str(b) + "]\n"


def test_compound_expressions_are_parenthesised_next_to_operators():
    texts = [f"y = x * {s['W'] - s['KW'] + 1} - {s['B']}\nz = zeros([{s['W'] - s['KW'] + 1}])\n"
             for s in SAMPLES]
    assert merge(texts, SAMPLES) == "y = x * (W - KW + 1) - B\nz = zeros([W - KW + 1])\n"


def test_a_float_that_is_no_whole_number_is_an_error_naming_its_line():
    texts = [f"a = 1\nc = full([], {1 / s['D'] ** 0.5!r}, dtype=f32)\n" for s in SAMPLES]
    with pytest.raises(NotGeneric, match=r"is no single expression of the dimensions \(line 2: "
                                         r"c = full\(\[\], 0\.\d+, dtype=f32\)\)"):
        merge(texts, SAMPLES)


def test_text_that_changes_in_more_than_its_numbers_is_an_error_showing_it():
    texts = ["a = arange(5)\n"] + ["b = expand_dims(a, 1)\n"] * (len(SAMPLES) - 1)
    with pytest.raises(NotGeneric, match="changes with the sizes in more than its numbers: "
                                         "a = arange[(]5[)] / b = expand_dims"):
        merge(texts, SAMPLES)
