// A consumer in JavaScript reading messages delayq published (docs/reference/wire.md):
//   node consume.js URL QUEUE COUNT
// prints one JSON line per message (id, routing key, content type, headers, the body
// as text and the time it arrived), acks it, and exits 0 after COUNT, or 1 after 60 s.
"use strict";

const amqp = require("amqplib");

async function main() {
  const [url, queue, countText] = process.argv.slice(2);
  const count = Number(countText);
  const connection = await amqp.connect(url);
  const channel = await connection.createChannel();
  await channel.prefetch(100);
  let seen = 0;
  const done = new Promise((resolve) => {
    channel.consume(queue, (msg) => {
      const headers = {};
      for (const [k, v] of Object.entries(msg.properties.headers || {})) {
        headers[k] = Buffer.isBuffer(v) ? v.toString("utf8") : v;
      }
      console.log(
        JSON.stringify({
          message_id: msg.properties.messageId,
          routing_key: msg.fields.routingKey,
          content_type: msg.properties.contentType,
          headers,
          body: msg.content.toString("utf8"),
          at_ms: Date.now(),
        })
      );
      channel.ack(msg);
      seen += 1;
      if (seen >= count) resolve();
    });
  });
  let timer;
  const timeout = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`only ${seen} of ${count} in 60 s`)), 60000);
  });
  try {
    await Promise.race([done, timeout]);
  } finally {
    clearTimeout(timer); // a pending timer would hold the process open for the 60 s
  }
  await channel.close();
  await connection.close();
}

main().catch((err) => {
  console.error(`consume.js: ${err.message}`);
  process.exit(1);
});
