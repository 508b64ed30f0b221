"""The shared core every model family is built on: schedules, masks, cache, backbones, decoding."""
