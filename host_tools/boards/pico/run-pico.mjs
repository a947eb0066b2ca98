#!/usr/bin/env node
// run-pico.mjs - run a real Raspberry Pi Pico (RP2040) firmware image in the
// rp2040js emulator and expose its USB CDC serial port on stdin/stdout, so it
// can be wrapped by socat into a pty and driven with mpremote.
//
// Usage:
//   node run-pico.mjs --image firmware.uf2 --bootrom bootrom-b1.bin \
//        [--flash flash-state.bin] [--fs littlefs.img] [--stats stats.json] [--log run.log]
//
//   --image    MicroPython firmware, UF2 (or a raw .bin loaded at 0x10000000)
//   --bootrom  16 KiB RP2040 B1 bootrom binary (see build.sh: extracted from
//              the rp2040js repository's demo/bootrom.ts); default: bootrom-b1.bin
//              beside this file or in $OUT/
//   --flash    optional file holding the whole 2 MiB flash; loaded at start
//              (before the firmware is written over it) and saved back after
//              every flash erase/program burst and at exit: the MicroPython
//              filesystem survives restarts of the emulator.
//   --fs       optional littlefs image written at the MicroPython FS offset
//              (0xA0000 for RPI_PICO, 1408 KiB) before boot.
//   --stats    optional JSON file rewritten about once a second with the
//              emulated CPU cycle count, simulated time and wall time.
//   --log      where diagnostics go (default: stderr). stdout is the serial port.
//
// Flash writes: rp2040js does not model the QSPI flash chip behind the SSI,
// so the bootrom's flash_range_erase / flash_range_program would silently do
// nothing.  We patch those two ROM functions with `bkpt #0xE0/0xE1; bx lr`
// and perform the operation on the emulated flash array in the onBreak hook.
//
// Send SIGUSR1 to force a stats dump.

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

// rp2040js: from node's normal resolution (node_modules beside or above this
// file), else $RP2040JS (the package folder), else $OUT/node_modules.
const HERE = path.dirname(fileURLToPath(import.meta.url));
async function loadRp2040js() {
  try { return await import('rp2040js'); } catch { /* try the fallbacks */ }
  for (const dir of [process.env.RP2040JS, path.join(HERE, 'node_modules/rp2040js')]) {
    if (dir && fs.existsSync(path.join(dir, 'dist/esm/index.js')))
      return import(pathToFileURL(path.join(dir, 'dist/esm/index.js')).href);
  }
  throw new Error('rp2040js not found: npm install rp2040js@1.4.1, or set RP2040JS');
}
const { Simulator, USBCDC, ConsoleLogger, LogLevel } = await loadRp2040js();

function parseArgs(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (!a.startsWith('--')) continue;
    const eq = a.indexOf('=');
    if (eq > 0) out[a.slice(2, eq)] = a.slice(eq + 1);
    else if (i + 1 < argv.length && !argv[i + 1].startsWith('--')) out[a.slice(2)] = argv[++i];
    else out[a.slice(2)] = true;
  }
  return out;
}

const args = parseArgs(process.argv.slice(2));
const log = (...m) => {
  const line = `[run-pico ${new Date().toISOString()}] ${m.join(' ')}\n`;
  if (args.log) fs.appendFileSync(args.log, line); else process.stderr.write(line);
};

if (!args.bootrom) {
  for (const p of [process.env.UTRAIN_PICO_BOOTROM, path.join(HERE, 'bootrom-b1.bin')].filter(Boolean))
    if (fs.existsSync(p)) { args.bootrom = p; break; }
}
if (!args.image || !args.bootrom) {
  process.stderr.write('usage: node run-pico.mjs --image firmware.uf2 --bootrom bootrom-b1.bin [--flash f.bin] [--fs lfs.img] [--stats s.json] [--log l.txt]\n');
  process.exit(2);
}

const FLASH_SIZE = 2 * 1024 * 1024; // Pico: 2 MiB W25Q16
const MP_FS_OFFSET = 0xa0000; // RPI_PICO: 2 MiB - 1408 KiB
const XIP_BASE = 0x10000000;

const simulator = new Simulator();
const mcu = simulator.rp2040;
mcu.logger = new ConsoleLogger(LogLevel.Error);

// ---- bootrom (loadBootrom() resets the chip and wipes flash: do it first)
const bootrom = fs.readFileSync(args.bootrom);
if (bootrom.length !== 16384) throw new Error(`bootrom must be 16384 bytes, got ${bootrom.length}`);
const romWords = new Uint32Array(bootrom.buffer.slice(bootrom.byteOffset, bootrom.byteOffset + 16384));

function romFunc(words, code) {
  const b = Buffer.from(words.buffer);
  let p = b.readUInt16LE(0x14);
  for (;;) {
    const c = b.readUInt16LE(p);
    if (!c) return null;
    if (c === (code.charCodeAt(0) | (code.charCodeAt(1) << 8))) return b.readUInt16LE(p + 2) & ~1;
    p += 4;
  }
}
const BKPT_ERASE = 0xe0;
const BKPT_PROGRAM = 0xe1;
for (const [code, imm] of [['RE', BKPT_ERASE], ['RP', BKPT_PROGRAM]]) {
  const addr = romFunc(romWords, code);
  if (addr == null || addr & 3) throw new Error(`cannot patch ROM function ${code}`);
  // little endian: first halfword = bkpt #imm (0xBExx), second = bx lr (0x4770)
  romWords[addr >> 2] = (0xbe00 | imm) | (0x4770 << 16);
}
mcu.loadBootrom(romWords);

// ---- flash contents
const flash = mcu.flash;
if (args.flash && fs.existsSync(args.flash)) {
  const img = fs.readFileSync(args.flash);
  flash.set(img.subarray(0, Math.min(img.length, FLASH_SIZE)), 0);
  log(`loaded flash state ${args.flash} (${img.length} bytes)`);
}
if (args.fs) {
  const img = fs.readFileSync(args.fs);
  flash.set(img, MP_FS_OFFSET);
  log(`loaded fs image ${args.fs} at 0x${MP_FS_OFFSET.toString(16)} (${img.length} bytes)`);
}

function loadUF2(buf) {
  let n = 0;
  for (let off = 0; off + 512 <= buf.length; off += 512) {
    const m0 = buf.readUInt32LE(off), m1 = buf.readUInt32LE(off + 4), m2 = buf.readUInt32LE(off + 508);
    if (m0 !== 0x0a324655 || m1 !== 0x9e5d5157 || m2 !== 0x0ab16f30) throw new Error(`bad UF2 block at ${off}`);
    const flags = buf.readUInt32LE(off + 8);
    if (flags & 1) continue; // "not main flash"
    const addr = buf.readUInt32LE(off + 12), size = buf.readUInt32LE(off + 16);
    if (addr < XIP_BASE || addr + size > XIP_BASE + FLASH_SIZE) continue;
    flash.set(buf.subarray(off + 32, off + 32 + size), addr - XIP_BASE);
    n++;
  }
  return n;
}
const image = fs.readFileSync(args.image);
if (args.image.endsWith('.uf2')) log(`loaded ${loadUF2(image)} UF2 blocks from ${args.image}`);
else { flash.set(image, 0); log(`loaded raw image ${args.image} (${image.length} bytes)`); }

// ---- flash erase/program emulation through the patched ROM functions
let flashDirty = false;
let flashOps = 0;
mcu.onBreak = (code) => {
  const r = mcu.core.registers;
  if (code === BKPT_ERASE) {
    // flash_range_erase(uint32_t addr, size_t count, uint32_t block_size, uint8_t block_cmd)
    const addr = r[0] & 0xffffff, count = r[1] >>> 0;
    const start = addr & ~0xfff, end = Math.min(FLASH_SIZE, (addr + count + 0xfff) & ~0xfff);
    flash.fill(0xff, start, end);
    flashDirty = true; flashOps++;
    return; // PC already points at the following `bx lr`
  }
  if (code === BKPT_PROGRAM) {
    // flash_range_program(uint32_t addr, const uint8_t *data, size_t count)
    const addr = r[0] & 0xffffff, src = r[1] >>> 0, count = r[2] >>> 0;
    for (let i = 0; i < count && addr + i < FLASH_SIZE; i++) {
      flash[addr + i] &= mcu.readUint8(src + i); // NOR flash: program only clears bits
    }
    flashDirty = true; flashOps++;
    return;
  }
  log(`unexpected BKPT #${code} at PC=0x${(mcu.core.PC - 2).toString(16)}; stopping`);
  simulator.stop();
  shutdown(3);
};

function saveFlash() {
  if (args.flash && flashDirty) {
    fs.writeFileSync(args.flash, flash.subarray(0, FLASH_SIZE));
    flashDirty = false;
  }
}

// ---- USB CDC <-> stdin/stdout
const cdc = new USBCDC(mcu.usbCtrl);
const pending = [];
let pendingPos = 0;
function pump() {
  while (pending.length && !cdc.txFIFO.full) {
    const chunk = pending[0];
    while (pendingPos < chunk.length && !cdc.txFIFO.full) cdc.sendSerialByte(chunk[pendingPos++]);
    if (pendingPos >= chunk.length) { pending.shift(); pendingPos = 0; }
  }
}
const cdcRead = mcu.usbCtrl.onEndpointRead;
mcu.usbCtrl.onEndpointRead = (endpoint, size) => { pump(); cdcRead(endpoint, size); };
cdc.onDeviceConnected = () => log('USB CDC connected');
let bytesOut = 0, bytesIn = 0;
cdc.onSerialData = (value) => { bytesOut += value.length; process.stdout.write(Buffer.from(value)); };

if (process.stdin.isTTY) process.stdin.setRawMode(true);
process.stdin.on('data', (chunk) => { bytesIn += chunk.length; pending.push(chunk); pump(); });
process.stdin.on('end', () => { log('stdin closed'); shutdown(0); });

// ---- stats
const wallStart = Date.now();
function stats() {
  return {
    cycles: mcu.core.cycles,
    sim_seconds: simulator.clock.nanos / 1e9,
    wall_seconds: (Date.now() - wallStart) / 1000,
    mhz_effective: mcu.core.cycles / 1e6 / Math.max(1e-9, (Date.now() - wallStart) / 1000),
    flash_ops: flashOps,
    serial_bytes_to_host: bytesOut,
    serial_bytes_from_host: bytesIn,
  };
}
function writeStats() { if (args.stats) fs.writeFileSync(args.stats, JSON.stringify(stats()) + '\n'); }
const statsTimer = setInterval(() => { writeStats(); saveFlash(); }, 1000);
process.on('SIGUSR1', () => { writeStats(); log(JSON.stringify(stats())); });

let shuttingDown = false;
function shutdown(rc) {
  if (shuttingDown) return;
  shuttingDown = true;
  clearInterval(statsTimer);
  simulator.stop();
  try { saveFlash(); } catch (e) { log(`saving flash failed: ${e}`); }
  writeStats();
  log(`exit: ${JSON.stringify(stats())}`);
  process.exit(rc);
}
for (const s of ['SIGINT', 'SIGTERM', 'SIGHUP']) process.on(s, () => shutdown(0));

mcu.core.PC = 0x10000000;
log('starting');
simulator.execute();
