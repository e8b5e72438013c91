"""TensorFlow compositions for operators TF has no single function for (imported only when a
TensorFlow operator that names them runs)."""
from __future__ import annotations

import math

from .base import before_tensorflow

before_tensorflow()
import tensorflow as tf  # noqa: E402


def layer_norm(x, gamma, beta, epsilon=1e-5):
    mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
    return (x - mean) * tf.math.rsqrt(var + tf.cast(epsilon, x.dtype)) * gamma + beta


def rms_norm(x, gamma, epsilon=1e-6):
    ms = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
    return x * tf.math.rsqrt(ms + tf.cast(epsilon, x.dtype)) * gamma


def attention(query, key, value):
    scale = tf.cast(1.0 / math.sqrt(int(query.shape[-1])), query.dtype)
    scores = tf.linalg.matmul(query, key, transpose_b=True) * scale
    return tf.linalg.matmul(tf.nn.softmax(scores, axis=-1), value)
