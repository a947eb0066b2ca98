"""A simulated board on a serial port (tests, `fleet`): unix MicroPython in interactive mode with its
stdin/stdout on one pseudo-terminal, relayed to a second pseudo-terminal whose path
mpremote opens as the board's port (what socat's PTY,link does).  The temp folder it
runs in plays the board's flash; MICROPYPATH holds lib like a board's sys.path.  Use
`mpremote connect PORT resume ...`: the unix port exits on a soft reset.

A board turns a Ctrl-C byte arriving while a program runs into KeyboardInterrupt; the
unix port only does that for SIGINT.  So the relay sends SIGINT for a Ctrl-C that
arrives while MicroPython is not waiting for input (Linux's /proc/PID/syscall says
whether it is blocked reading stdin), and passes it on as a byte otherwise."""
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
                if fd == b and b'\x03' in data and not self._waiting_for_input():
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
