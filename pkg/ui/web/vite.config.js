import { defineConfig } from 'vite';

// The dashboard is served by tether at /ui/ from assets embedded in the binary (pkg/ui/dist).
export default defineConfig({
  base: '/ui/',
  build: {
    outDir: '../dist',
    emptyOutDir: true,
    sourcemap: false,
    modulePreload: { polyfill: false },
  },
});
