"""A simulated board on a serial port (tests, `fleet`): unix MicroPython in interactive mode with its
stdin/stdout on one pseudo-terminal, relayed to a second pseudo-terminal whose path
mpremote opens as the board's port (what socat's PTY,link does).  The temp folder it
runs in plays the board's flash; MICROPYPATH holds lib like a board's sys.path.  Use
`mpremote connect PORT resume ...`: the unix port exits on a soft reset.

A board's UART interrupt turns a Ctrl-C byte into KeyboardInterrupt while the interrupt
character is enabled (micropython.kbd_intr(3), the default) and puts it into stdin like
any byte once a program disabled it (kbd_intr(-1): train.py does while it trains, and
takes the byte between samples).  The unix port raises KeyboardInterrupt only for
SIGINT, and only while its handler is installed; kbd_intr(-1) uninstalls it.  So the
relay sends SIGINT for a Ctrl-C only while MicroPython catches SIGINT (Linux's
/proc/PID/status, SigCgt) and is not blocked reading stdin (/proc/PID/syscall); it
passes the byte on otherwise.  It never sends SIGINT to a program that disabled the
interrupt character, which would end it like a power cut."""
import os
import pty
import select
import signal
import subprocess
import threading
import tty


class FakeBoard:
    def __init__(self, micropython, flash, heap='1M', hang_up=False):
        """hang_up: when MicroPython exits, close the port (as a dead board's USB serial
        port goes away), so mpremote fails at once instead of waiting for output."""
        self.flash, self.hang_up = flash, hang_up
        self._dev_m, dev_s = pty.openpty()      # MicroPython's side
        self._port_m, port_s = pty.openpty()    # mpremote's side
        for fd in (dev_s, port_s):
            tty.setraw(fd)
        self.port = os.ttyname(port_s)
        self._port_s = port_s                   # kept open so the relay never sees EOF
        env = dict(os.environ, MICROPYPATH=':lib')
        self.proc = subprocess.Popen([micropython, '-X', 'heapsize=' + heap, '-i'],
                                     stdin=dev_s, stdout=dev_s, stderr=dev_s, cwd=flash,
                                     env=env, close_fds=True)
        os.close(dev_s)
        self._stop = False
        self._fd_lock = threading.Lock()
        self._t = threading.Thread(target=self._relay, daemon=True)
        self._t.start()

    def _relay(self):
        a, b = self._dev_m, self._port_m
        while not self._stop:
            r, _, _ = select.select([a, b], [], [], 0.1)
            for fd in r:
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    data = b''
                if not data:
                    if fd == a:                 # MicroPython exited
                        if self.hang_up:
                            self._hang_up()
                        return
                    continue
                if fd == b and b'\x03' in data and self._interrupt_char_enabled() \
                        and not self._waiting_for_input():
                    self.proc.send_signal(signal.SIGINT)
                    data = data.replace(b'\x03', b'')
                if data:
                    os.write(b if fd == a else a, data)

    def _hang_up(self):
        # closing the master side makes mpremote's reads fail at once (EIO) rather than
        # wait for output that never comes
        with self._fd_lock:
            fds, self._port_m, self._port_s = (self._port_m, self._port_s), None, None
        for fd in fds:
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass

    def _waiting_for_input(self):
        try:
            with open('/proc/%d/syscall' % self.proc.pid) as f:
                return f.read().startswith('0 0x0 ')      # read(0, ...)
        except OSError:
            return True

    def _interrupt_char_enabled(self):
        # SIGINT (signal 2: bit 1) among the caught signals
        try:
            with open('/proc/%d/status' % self.proc.pid) as f:
                for line in f:
                    if line.startswith('SigCgt:'):
                        return bool(int(line.split()[1], 16) & 2)
        except OSError:
            pass
        return False

    def alive(self):
        return self.proc.poll() is None

    def close(self):
        self._stop = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._t.join(2)
        self._hang_up()
        try:
            os.close(self._dev_m)
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def start(board='unix', emulate=False, flash=None, ulab=False):
    """`utrain board`: a simulated board on a serial port, an object with .port (the path
    mpremote, deploy, pull and fleet --ports open) and .close().  board: the
    boards/boards.json profile whose heap it gets; flash: the folder that plays its file
    system (default: a new temporary folder).  emulate: an emulated Raspberry Pi Pico
    instead of unix MicroPython (emulated(); ulab: its firmware with ulab)."""
    import tempfile
    from ..target import runner
    profiles = runner.boards()
    board = runner.board_name(board, profiles)
    flash = flash or tempfile.mkdtemp(prefix='utrain-board-')
    os.makedirs(flash, exist_ok=True)
    if emulate:
        return emulated(board, flash, ulab)
    return FakeBoard(runner.micropython_binary(), flash, heap=profiles[board]['heap'], hang_up=True)


def emulated(board, flash, ulab=False):
    """`utrain board --emulate`: the emulated Pico (host_tools/boards/pico.py: the real rp2
    firmware in rp2040js) behind a pseudo-terminal.  Its 2 MiB flash image is kept in the
    flash folder (.pico-flash.bin: a deployed board stays deployed); a new image gets the
    folder's files as its file system."""
    from . import pico
    if board not in ('unix', 'rp2040'):
        raise ValueError(f'--emulate: the emulated board is a Raspberry Pi Pico (rp2040), '
                         f'not {board}')
    image = os.path.join(flash, '.pico-flash.bin')
    files = None
    if not os.path.exists(image):
        files = {}
        for root, dirs, names in os.walk(flash):
            dirs[:] = [d for d in dirs if not d.startswith('.')]
            for n in names:
                if not n.startswith('.'):
                    p = os.path.join(root, n)
                    files[os.path.relpath(p, flash).replace(os.sep, '/')] = p
    b = pico.PicoBoard(image, ulab=ulab, files=files)
    b.alive = lambda: b.proc.poll() is None
    return b
