import pytest

from builders.box_frame import (
    frame224_to_pixels,
    from_model_frame,
    letterbox,
    pixels_to_frame224,
    to_model_frame,
)


def test_letterbox_of_a_mimic_portrait_image_matches_formats_md():
    r, left, top = letterbox(2544, 3056)
    assert round(r, 4) == 0.0733
    assert (left, top) == (19, 0)


def test_frame224_box_maps_back_to_the_same_anatomy():
    box, clipped = frame224_to_pixels([19, 0, 205, 224], 2544, 3056)
    assert not clipped
    assert box[0] == pytest.approx(0, abs=0.5) and box[1] == 0
    assert box[2] == pytest.approx(2544, abs=14) and box[3] == pytest.approx(3056, abs=1)


def test_box_in_padding_is_clipped_and_flagged():
    box, clipped = frame224_to_pixels([0, 0, 30, 30], 2544, 3056)
    assert clipped and box[0] == 0.0


@pytest.mark.parametrize("size", [(2544, 3056), (3056, 2544), (640, 800), (1000, 1000)])
def test_pixels_and_frame224_round_trip(size):
    w, h = size
    for raw in ([60, 40, 160, 150], [98, 30, 131, 180]):
        px, clipped = frame224_to_pixels(raw, w, h)
        assert not clipped
        assert max(abs(a - b) for a, b in zip(pixels_to_frame224(px, w, h), raw)) <= 1


@pytest.mark.parametrize("convention", ["pixels", "qwen2.5-vl", "norm1000", "frame224"])
def test_model_conventions_round_trip_within_rounding(convention):
    w, h = 636, 764
    box = [100.0, 200.0, 400.0, 700.0]
    back = from_model_frame(to_model_frame(box, w, h, convention), w, h, convention)
    assert all(abs(a - b) <= 4 for a, b in zip(back, box))
