# Frozen constants left in the model file (prepared with --stream) and read just
# before the op that needs them, into a few buffers reused by every op: frozen
# weights live on flash, not in the heap.  Imported only by models that stream.
#   slot j: one buffer as large as the largest j-th constant input of any op.
#   A constant larger than CHUNK floats at an input position its kernel reads by
#   rows (the kernel module's ROWS) is not fetched whole: the kernel walks it with
#   rt.stream.chunks(k), a few rows at a time through one CHUNK-float buffer.
from utrain.xnp import readinto, buffer, view

CHUNK = 1024


class Stream:
    def __init__(self, net, offs):
        self.net, self.offs = net, offs
        sh = net.shape
        self.ops = ops = []
        self.big = []
        for i in range(len(net.ops)):
            ins = net.ops[i][1]
            rows = getattr(net.mods[i], 'ROWS', ())
            mine = []
            big = 0
            for p in range(len(ins)):
                k = ins[p]
                if k not in offs:
                    continue
                n = sh[k][0] * sh[k][1]
                if p in rows and n > CHUNK:
                    big = max(big, sh[k][1])
                    continue
                mine.append((k, len(mine), n))
            ops.append(mine)
            self.big.append(big)
        # the buffers are made at the first fetch, for the ops from there on: a run
        # from a frozen-prefix cache (utrain.prefix) never holds the prefix's weights
        self.lo = None

    def _alloc(self, lo):
        self.slots = self.chunk = None
        sz, big = [], 0
        for i in range(lo, len(self.ops)):
            for _, j, n in self.ops[i]:
                if j == len(sz):
                    sz.append(n)
                elif sz[j] < n:
                    sz[j] = n
            big = max(big, self.big[i])
        self.slots = [buffer(n) for n in sz]
        self.chunk = buffer(max(big, CHUNK)) if big else None
        self.lo = lo

    def ready(self, i):
        """The slot buffers for ops i.. made (at the first call, for the ops from there on)."""
        if self.lo is None or i < self.lo:
            self._alloc(0 if self.lo is not None else i)

    def fetch(self, i):
        """Read op i's whole constant inputs into the slot buffers."""
        self.ready(i)
        net = self.net
        t, sh = net.t, net.shape
        f = None
        for k, j, _ in self.ops[i]:
            if f is None:
                f = open(net.path, 'rb')
            f.seek(self.offs[k])
            t[k] = readinto(f, view(self.slots[j], sh[k]), net.path)
        if f is not None:
            f.close()

    def drop(self, i):
        t = self.net.t
        for k, j, _ in self.ops[i]:
            t[k] = None

    def chunks(self, k):
        """Constant k a few rows at a time: yields (first row, rows array), the array
        a view of the one CHUNK-float buffer."""
        net = self.net
        r, c = net.shape[k]
        n = max(1, CHUNK // c)
        f = open(net.path, 'rb')
        try:
            f.seek(self.offs[k])
            for r0 in range(0, r, n):
                m = min(n, r - r0)
                yield r0, readinto(f, view(self.chunk, (m, c)), net.path)
        finally:
            f.close()
