"""The daemon's loops, one small module each. A loop body is a plain function
given the Runtime; it returns when `runtime.stop` is set, and every wait in it
is an Event wait, so a stop is seen at once."""
