# The viper decorator and pointer casts the int8 kernels are written with (q8kern, q8vk;
# q8cat, q8lut, q8sparse, q8pool and q8grow take them from q8kern): MicroPython's, or
# plain Python stand-ins over the same buffers under CPython and on a firmware without
# the native emitter (host_tools strips the decorators there: VIPER False).
try:
    import micropython
    VIPER = True
except ImportError:  # CPython: plain Python over the same buffers
    VIPER = False

    class micropython:
        @staticmethod
        def viper(f):
            return f

if not VIPER:
    def ptr8(b):
        return b

    ptr16 = ptr32 = ptr8
