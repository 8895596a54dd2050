// A Node.js process holding many small objects, strings and buffers, and
// doing a little work every 100 ms (so two snapshots see changed pages).
// Prints its PID. Used by docs/ANALYSIS.md: `node node_workload.js [N]`.
const n = Number(process.argv[2] || 2000000);
const users = [];
for (let i = 0; i < n; i++) {
  users.push({ id: i, name: 'user' + (i % 5000), city: ['Berlin', 'Paris', 'Rome', 'Oslo'][i % 4], score: Math.random() });
}
const index = new Map();
for (const u of users) index.set(u.id, u);
const blob = Buffer.alloc(64 << 20);                 // zero-filled, touched
const copy = Buffer.from(blob.subarray(0, 32 << 20)); // a copy of zeros
const text = Buffer.from('lorem ipsum dolor sit amet '.repeat(2000000));
let tick = 0;
setInterval(() => {
  for (let i = 0; i < 10000; i++) users[(tick * 10000 + i) % n].score = Math.random();
  tick++;
}, 100);
console.log(process.pid);
