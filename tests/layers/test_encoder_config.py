"""The light encoder config module agrees with the torch modules that build the encoder."""

from __future__ import annotations

import pytest

from attn_export.errors import ConfigError
from attn_export.layers import heads
from attn_export.layers.encoder_config import HEAD_ACTIVATIONS, EncoderConfig, HeadConfig, parse_layers


def test_every_sequence_head_activation_has_its_module():
    assert tuple(heads.ACTIVATION_MODULES) == HEAD_ACTIVATIONS


def test_configs_validate_on_construction():
    with pytest.raises(ConfigError, match="divisible by num_attention_heads"):
        EncoderConfig(hidden_size=66, num_attention_heads=4)
    with pytest.raises(ConfigError, match="no activation for a token head"):
        HeadConfig(task="token", style="linear", num_labels=2, activation="tanh")
    with pytest.raises(ConfigError, match="sequence head activation in tanh, gelu, relu"):
        HeadConfig(task="sequence", style="bert", num_labels=2, activation="softmax")
    assert parse_layers("all", 6) is None and parse_layers("5", 6) == 5
    with pytest.raises(ConfigError, match="0..5"):
        parse_layers(6, 6)
