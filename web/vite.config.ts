import { defineConfig } from 'vitest/config';

// The console is served by quotaplane-api at /console/; `npm run dev` proxies the API
// to a local `make run`.
export default defineConfig({
  base: '/console/',
  build: { outDir: 'dist', emptyOutDir: true, sourcemap: false, chunkSizeWarningLimit: 400 },
  server: {
    proxy: { '/v1': 'http://127.0.0.1:8080', '/console/api': 'http://127.0.0.1:8080' },
  },
  test: { environment: 'jsdom', include: ['src/**/*.test.ts', 'src/**/*.test.tsx'] },
});
