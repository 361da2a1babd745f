"""Record formats: TFRecord and ArrayRecord framing and reading, CRCs, shard formats and specs, the C
encoder and decoder of tf.train.Example and SequenceExample.

May import `schemas`, `images`, `files`, `errors` and `arrays`; never Beam.
"""
