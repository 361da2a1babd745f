"""Reading a published bundle back: with tf.data (`read`) and by index (`data_source`).

May import `records`, `schemas`, `files`, `errors`.
"""
