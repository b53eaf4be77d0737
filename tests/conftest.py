# reckeras selects Keras's torch backend; import it before any test module
# imports keras (Keras reads its backend once, at first import).
import reckeras  # noqa: F401
