"""What happens at a call: binding arguments to descriptors, allocating outputs, invoking the
compiled code, callbacks, and turning results into numpy values."""
