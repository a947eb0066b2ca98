"""The emulated Cortex-M0 board (RP2040's CPU) for tests and bench: MicroPython's qemu
port on qemu's microbit machine with 4 MB of SRAM, the armv6m native emitter, littlefs
on a RAM block device and the GC heap size chosen at boot (../shared/board-sim.md; the
firmware is built outside this repository and named by $UTRAIN_M0 / $UTRAIN_M0_ULAB).
Its UART is a pseudo-terminal that the real mpremote and `host_tools deploy/pull` open
as the board's port.

    with M0Board(elf, heap=120 * 1024) as b:
        subprocess.run([..., 'mpremote', 'connect', b.port, 'run', 'train.py'])

The file system starts empty at each boot; `save_fs(path)` snapshots it (qemu's monitor
memsave of the block device) and `M0Board(elf, heap, fs=path)` boots with it, so a
deployed run can be retried at many heap sizes without copying it again."""
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time

HEAP_WORD = 0x20100000        # main.c reads the heap size here at boot
FS_ADDR, FS_SIZE = 0x20101000, 1 << 20
MAX_HEAP = 786432


def qemu():
    return shutil.which('qemu-system-arm')


class M0Board:
    def __init__(self, elf, heap=0, fs=None, timeout=20):
        if heap and not 4096 <= heap <= MAX_HEAP:
            raise ValueError(f'heap {heap}: the emulated board takes 4096..{MAX_HEAP} bytes')
        self.tmp = tempfile.mkdtemp(prefix='m0board-')
        self.monitor = os.path.join(self.tmp, 'mon')
        argv = [qemu(), '-machine', 'microbit', '-global', 'nrf51-soc.flash-size=1048576',
                '-global', 'nrf51-soc.sram-size=4194304', '-nographic', '-semihosting',
                '-monitor', f'unix:{self.monitor},server,nowait',
                '-device', f'loader,addr={HEAP_WORD:#x},data={int(heap)},data-len=4',
                '-serial', 'pty', '-kernel', elf]
        if fs:
            argv += ['-device', f'loader,file={fs},addr={FS_ADDR:#x},force-raw=on']
        self._log = open(os.path.join(self.tmp, 'log'), 'w+')
        self.proc = subprocess.Popen(argv, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.port = None
        end = time.time() + timeout
        while time.time() < end and self.proc.poll() is None:
            self._log.seek(0)
            m = re.search(r'/dev/pts/\d+', self._log.read())
            if m and os.path.exists(self.monitor):
                self.port = m.group(0)
                break
            time.sleep(0.05)
        if not self.port:
            self._log.seek(0)
            out = self._log.read()
            self.close()
            raise RuntimeError(f'qemu did not start the board: {out.strip()[-300:]}')

    def _monitor(self, cmd, wait=30):
        s = socket.socket(socket.AF_UNIX)
        s.connect(self.monitor)
        s.settimeout(wait)
        s.sendall(cmd.encode() + b'\n')
        buf = b''
        end = time.time() + wait
        while time.time() < end:       # the monitor echoes the command, then prompts
            try:
                chunk = s.recv(4096)
            except socket.timeout:
                break
            if not chunk:
                break
            buf += chunk
            if buf.count(b'(qemu)') >= 2:
                break
        s.close()
        return buf.decode(errors='replace')

    def save_fs(self, path):
        """Write the board's file system (the RAM block device) to path."""
        if os.path.exists(path):
            os.remove(path)
        self._monitor(f'memsave {FS_ADDR:#x} {FS_SIZE} "{os.path.abspath(path)}"')
        for _ in range(100):
            if os.path.exists(path) and os.path.getsize(path) == FS_SIZE:
                return path
            time.sleep(0.05)
        raise RuntimeError(f'qemu did not save the file system to {path}')

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def mpremote(port, *args, cwd=None, timeout=900):
    import sys
    return subprocess.run([sys.executable, '-m', 'mpremote', 'connect', port, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def deployed_image(elf, out_dir, image):
    """Deploy the prepared folder out_dir (host_tools deploy: .mpy for the board's arch)
    onto a fresh board and save its file system to image."""
    from host_tools.boards.board import deploy
    with M0Board(elf) as b:
        deploy(out_dir, b.port)
        b.save_fs(image)
    return image


def trains_in(elf, out_dir, heap, image):
    """Does train.py finish (weights saved) on the board booted with `heap` bytes of GC
    heap and the deployed file system `image`?  Returns (ok, output)."""
    with M0Board(elf, heap, fs=image) as b:
        r = mpremote(b.port, 'run', 'train.py', cwd=out_dir)
    out = r.stdout + r.stderr
    ok = r.returncode == 0 and ('saved ' in out or 'holds the best weights' in out)
    return ok and 'out of memory' not in out and 'MemoryError' not in out, out


def smallest_heap(elf, out_dir, lo=16 * 1024, hi=MAX_HEAP, step=1024, image=None):
    """The smallest GC heap (bytes, within step) in which the deployed run trains on the
    emulated board, or None."""
    image = image or deployed_image(elf, out_dir, os.path.join(out_dir, '.m0fs.img'))
    from host_tools.plan.memory import bisect_heap
    return bisect_heap(lambda heap: trains_in(elf, out_dir, heap, image)[0], lo, hi, step)
